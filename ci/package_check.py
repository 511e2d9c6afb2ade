"""The package as an index gets it: ``python -m build`` makes the sdist, then the wheel from the
sdist; ``twine check --strict`` reads both. The wheel holds every module of the package and
``py.typed``; neither holds tests; the sdist holds the C source and the index page's text, which
links nowhere relative; a wheel built from the sdist without a C compiler leaves the C loops out.

Usage: python ci/package_check.py   (needs the ``package`` extra: build, twine)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str, env: dict | None = None) -> None:
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"{proc.stdout}{proc.stderr}package check: {' '.join(args)} failed")


def _check_wheel(wheel: Path) -> list:
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(REPO)) for p in (REPO / "mpisync").rglob("*.py")}
    problems = [f"the wheel lacks {m}" for m in sorted(modules - names)]
    problems += [] if "mpisync/py.typed" in names else ["the wheel lacks mpisync/py.typed"]
    problems += [f"the wheel holds {n}" for n in sorted(names) if n.startswith("tests/")]
    return problems


def _check_sdist(sdist: Path) -> list:
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        description = tar.extractfile(next(n for n in tar.getnames() if n.endswith("/PKG-INFO")))
        assert description is not None
        text = description.read().decode()
    problems = [f"the sdist lacks {n}" for n in ("mpisync/_speedups.c", "docs/pypi.md", "LICENSE")]
    problems = [p for p in problems if p.rsplit(" ", 1)[1] not in names]
    problems += [f"the sdist holds {n}" for n in sorted(names) if n.startswith("tests/")]
    # an index page has no repository beside it: a relative link or image breaks there
    targets = re.findall(r"\]\(([^)\s]+)", text)
    problems += [f"the description links to {t}" for t in targets if "://" not in t]
    return problems


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="mpisync-package-") as folder:
        return _check(Path(folder))


def _check(out: Path) -> int:
    """Build into ``out`` and check what was built; 0 when every check passes."""
    _run(sys.executable, "-m", "build", "--outdir", str(out / "dist"), str(REPO))
    sdist = next((out / "dist").glob("mpisync-*.tar.gz"))
    wheel = next((out / "dist").glob("mpisync-*.whl"))
    _run(sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel))
    problems = _check_wheel(wheel) + _check_sdist(sdist)
    # the C loops are optional: without a compiler the wheel is built without them
    plain = out / "no-compiler"
    env = dict(os.environ, CC="false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "-w",
        str(plain),
        str(sdist),
        env=env,
    )
    without = next(plain.glob("mpisync-*.whl"))
    names = zipfile.ZipFile(without).namelist()
    problems += [f"built with CC=false, the wheel holds {n}" for n in names if "_speedups." in n]
    problems += _check_wheel(without)
    compiled = any("_speedups." in n for n in zipfile.ZipFile(wheel).namelist())
    if problems:
        print("package check FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(
        f"package check: {sdist.name} and {wheel.name} pass twine check --strict; the wheel holds "
        f"py.typed{' and the C loops' if compiled else ' (no C compiler here: no C loops)'}; "
        "without a compiler the wheel builds without them; no tests in either"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
