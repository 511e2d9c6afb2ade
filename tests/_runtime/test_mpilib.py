"""No MPI library: ``import mpisync`` says how to install one, with mpi4py's error chained."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cannot_load_mpi_library_says_how_to_install_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_"))}
    env.update(MPI4PY_LIBMPI=str(tmp_path / "libmpi.so.12"), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", "import mpisync"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ImportError: mpisync: mpi4py cannot load an MPI library; install one: pip install "
        '"mpisync[mpich]"'
    ), proc.stderr
    assert last.endswith("mpi4py said: cannot load MPI library")
    # mpi4py's own error, with the library it tried, is chained above it
    assert "RuntimeError: cannot load MPI library" in proc.stderr
    assert "The above exception was the direct cause of the following exception" in proc.stderr
    assert str(tmp_path / "libmpi.so.12") in proc.stderr
