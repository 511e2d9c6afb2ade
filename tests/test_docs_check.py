"""ci/check_docs.py: the repository passes it, and a planted broken link and date fail it."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "ci" / "check_docs.py"


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_repository_passes():
    proc = _check(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == ""


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "mpisync").mkdir()
    (root / "docs" / "index.md").write_text("# Index\n\n## Settings\n\nSee [a](other.md).\n")
    (root / "docs" / "other.md").write_text("# Other\n\n[back](index.md#settings)\n")
    (root / "README.md").write_text("# Readme\n\n[docs](docs/index.md)\n")
    (root / "mpisync" / "mod.py").write_text('"""Module (docs/index.md, Settings)."""\n')
    return root


def test_a_clean_tree_passes(tmp_path):
    proc = _check(_tree(tmp_path))
    assert proc.returncode == 0, proc.stdout


def test_planted_problems_are_each_reported(tmp_path):
    root = _tree(tmp_path)
    (root / "docs" / "other.md").write_text(
        "# Other\n\n[gone](missing.md) and [no such section](index.md#history).\n\n"
        "Measured on 2026-01-02 at commit 4b49863.\n"
    )
    (root / "README.md").write_text("# Readme\n\n[docs](docs/nowhere.md)\n")
    (root / "mpisync" / "mod.py").write_text(
        '"""Module (docs/index.md, History; docs/gone.md)."""\n\n# tuned on 2026-03-04\nX = 1\n'
    )
    proc = _check(root)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    expected = [
        "docs/other.md:3: link to a missing file: missing.md",
        "docs/other.md:3: link to a missing heading: index.md#history",
        "docs/other.md:5: date or commit hash: 2026-01-02",
        "docs/other.md:5: date or commit hash: 4b49863",
        "README.md:3: link to a missing file: docs/nowhere.md",
        "mpisync/mod.py: names a missing section: docs/index.md, 'History'",
        "mpisync/mod.py: names a missing page: docs/gone.md",
        "mpisync/mod.py:3: date or commit hash: 2026-03-04",
    ]
    assert sorted(lines) == sorted(expected)


def test_changes_and_digests_in_output_are_exempt(tmp_path):
    root = _tree(tmp_path)
    (root / "CHANGES.md").write_text("# Changes\n\n## 0.1.0 - 2026-01-02\n")
    shutil.copy(root / "docs" / "index.md", root / "docs" / "copy.md")
    with (root / "docs" / "copy.md").open("a") as page:
        page.write("\n```text\nrank 0: digest before bfc4401a52a6d552\n```\n")
    proc = _check(root)
    assert proc.returncode == 0, proc.stdout
