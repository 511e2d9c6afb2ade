"""The CI scripts' own logic: the GPU check's files in a folder of its own (ci/gpu-check.sh)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_writes_into_a_folder_of_its_own(tmp_path):
    # A log name planted in the shared temporary folder (another user's file, or a link to one)
    # is never written through: each run makes its own folder, named after the user.
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy(ROOT / "ci" / "gpu-check.sh", repo / "ci")  # a tree without .whl/: fails at once
    shared = tmp_path / "tmp"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    for name in ("gpu-check.log", "mpisync-gpu-check-runs", "mpisync-gpu-check"):
        (shared / name).symlink_to(victim)
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(TMPDIR=str(shared), USER="ci-user")
    logs = []
    for _ in range(2):
        proc = subprocess.run(
            ["bash", str(repo / "ci" / "gpu-check.sh"), "--dry-run"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1 and "FAIL install: no wheels in .whl/" in proc.stdout
        logs.append(proc.stdout.strip().splitlines()[-1].removeprefix("gpu-check: log: "))
    assert victim.read_text() == "not yours\n"
    assert logs[0] != logs[1]
    for log in map(Path, logs):
        assert log.parent.parent == shared and log.parent.name.startswith(
            "mpisync-gpu-check-ci-user."
        )
        assert "FAIL install" in log.read_text() and not (log.parent / "prefix").exists()
