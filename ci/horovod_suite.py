"""Run Horovod's own PyTorch test file against mpisync.horovod, one bounded job per test.

    python ci/horovod_suite.py PATH/test_torch.py [-n 2] [-k SUBSTR ...] [--timeout 60]

``PATH/test_torch.py`` is Horovod's ``test/parallel/test_torch.py`` (with Horovod's
``test/utils/common.py`` at ``PATH/../utils/common.py``, where the test file looks for it); it
is read where it lies, never copied. A resolver package generated into a temporary directory on
``PYTHONPATH`` makes ``import horovod.torch`` import :mod:`mpisync.horovod`. Each test runs as
``MPIEXEC_TIMEOUT=T timeout T+10 mpiexec -n N python -m pytest -q PATH::TorchTests::test_x``;
the table printed gives each test's outcome (pass, fail, skip, hang) and the first error line,
then the counts.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# The resolver: horovod.torch is mpisync.horovod; what Horovod's test helpers import from the
# rest of horovod, and the two packages common.py imports, are given the little they use.
_RESOLVER = {
    "horovod/__init__.py": '__version__ = "0.28.1"\n',
    "horovod/torch/__init__.py": (
        "import sys\nimport mpisync.horovod as _hvd\nsys.modules[__name__] = _hvd\n"
    ),
    "horovod/runner/__init__.py": "",
    "horovod/runner/util/__init__.py": "",
    "horovod/runner/util/threads.py": (
        "import threading\n\n\n"
        "def in_thread(target, args=(), name=None, daemon=True, silent=False):\n"
        "    thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)\n"
        "    thread.start()\n"
        "    return thread\n"
    ),
}
_FALLBACKS = {
    "mock": "mock.py",
    "cloudpickle": "cloudpickle.py",
}
_FALLBACK_TEXT = {
    "mock.py": "from unittest.mock import *  # noqa: F401,F403\n",
    "cloudpickle.py": (
        "def dumps(obj):\n    raise NotImplementedError('cloudpickle is not installed')\n\n\n"
        "loads = dumps\n"
    ),
}


def write_resolver(root: Path) -> None:
    """Write the ``horovod`` resolver package (and stand-ins for missing helpers) under
    ``root``."""
    for rel, text in _RESOLVER.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for module, rel in _FALLBACKS.items():
        found = subprocess.run(
            [sys.executable, "-c", f"import {module}"], capture_output=True
        ).returncode
        if found != 0:
            (root / rel).write_text(_FALLBACK_TEXT[rel])


def test_names(path: Path) -> list[str]:
    """The ``test_*`` methods of ``TorchTests``, in file order."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TorchTests":
            return [
                f.name
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")
            ]
    raise SystemExit(f"{path}: no class TorchTests")


_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors)\b")


def classify(rc: int, output: str) -> tuple[str, str]:
    """``(outcome, first error line)`` of one test's job."""
    if rc in (124, 137) or "MPIEXEC_TIMEOUT" in output or "timeout" in output[-400:].lower():
        if rc != 0 and not _SUMMARY.search(output[-2000:]):
            return "hang", "timed out"
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for number, kind in _SUMMARY.findall(output):
        counts["error" if kind.startswith("error") else kind] += int(number)
    first = next(
        (line[2:].strip() for line in output.splitlines() if line.startswith("E ")),
        "",
    )
    if counts["failed"] or counts["error"] or (rc != 0 and not counts["skipped"]):
        if not first:
            tail = [line for line in output.splitlines() if line.strip()]
            first = tail[-1] if tail else f"exit status {rc}"
        return "fail", first
    if counts["skipped"] and not counts["passed"]:
        reason = re.search(r"SKIPPED \[\d+\] [^:]+:\d+: (.*)", output)
        return "skip", reason.group(1) if reason else ""
    if counts["passed"]:
        return "pass", ""
    return "fail", first or f"exit status {rc}, no pytest summary"


def run_one(path: Path, name: str, ranks: int, timeout: int, env: dict) -> tuple[str, str]:
    """Run one test under mpiexec, bounded; its outcome."""
    command = [
        "timeout",
        "-k",
        "10",
        str(timeout + 10),
        "mpiexec",
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rs",
        f"{path}::TorchTests::{name}",
    ]
    job_env = {**env, "MPIEXEC_TIMEOUT": str(timeout)}
    try:
        done = subprocess.run(
            command,
            env=job_env,
            capture_output=True,
            text=True,
            cwd=path.parent,
            check=False,
            timeout=timeout + 30,
        )
    except subprocess.TimeoutExpired:
        return "hang", f"still running {timeout + 30} s after it started"
    return classify(done.returncode, done.stdout + done.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path, help="Horovod's test/parallel/test_torch.py")
    parser.add_argument("-n", "--ranks", type=int, default=2)
    parser.add_argument("-k", "--only", action="append", default=[], help="name substring")
    parser.add_argument("--timeout", type=int, default=60, help="MPIEXEC_TIMEOUT per test")
    args = parser.parse_args(argv)
    path = args.test_file.resolve()
    names = [n for n in test_names(path) if not args.only or any(k in n for k in args.only)]
    with tempfile.TemporaryDirectory(prefix="hvd-resolver-") as tmp:
        write_resolver(Path(tmp))
        pythonpath = os.pathsep.join(
            p
            for p in [
                tmp,
                str(Path(__file__).resolve().parent.parent),
                os.environ.get("PYTHONPATH", ""),
            ]
            if p
        )
        env = {**os.environ, "PYTHONPATH": pythonpath}
        results = []
        for name in names:
            outcome, first = run_one(path, name, args.ranks, args.timeout, env)
            results.append((name, outcome, first))
            print(f"{outcome:5} {name:60} {first[:160]}", flush=True)
    counts = {k: sum(1 for _, o, _ in results if o == k) for k in ("pass", "fail", "skip", "hang")}
    print(
        f"\n{len(results)} tests at {args.ranks} ranks: "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
    )
    return 0 if counts["fail"] == counts["hang"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
