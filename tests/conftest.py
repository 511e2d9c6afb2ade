"""Test harness shared by every rank.

Under ``mpiexec`` a test that fails on one rank would leave the others waiting
in the next collective; instead the failing rank prints its report and aborts
the whole job, so CI fails fast and never hangs. Every ``mpiexec`` started by a
test is bounded by ``MPIEXEC_TIMEOUT`` and a subprocess timeout.
"""

import importlib.util
import os
import sys
import time

import pytest

from cliutil import installed  # noqa: F401  (the fixture of the command-line tests)


def _hide_the_torch_test_folder() -> None:
    """Without torch installed, ``import torch`` would find ``tests/torch`` (a folder on pytest's
    pythonpath, named after mpisync's subpackage) as a namespace package, and
    ``pytest.importorskip("torch")`` would not skip: make ``import torch`` fail instead."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin is None:  # a namespace package: a folder, not torch
        sys.modules["torch"] = None  # type: ignore[assignment]


_hide_the_torch_test_folder()

# The torch backend's argument check is opt-in for users (MPISYNC_TORCH_CHECK=1); the suite runs
# with it on, so that every refusal test sees the error agreed on every rank.
# tests/torch/test_argument_check.py covers the default, without it.
os.environ.setdefault("MPISYNC_TORCH_CHECK", "1")


def _world_size() -> int:
    if "mpi4py.MPI" not in sys.modules:
        return 1
    from mpi4py import MPI

    return MPI.COMM_WORLD.size if MPI.Is_initialized() and not MPI.Is_finalized() else 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _world_size() > 1:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.rank
        sys.stderr.write(
            f"\n[rank {rank}] FAILED {item.nodeid} ({report.when})\n{report.longreprtext}\n"
        )
        sys.stderr.write(f"[rank {rank}] aborting every rank so none is left waiting\n")
        sys.stderr.flush()
        time.sleep(0.5)
        MPI.COMM_WORLD.Abort(1)


def pytest_collection_modifyitems(config, items):
    # Launcher tests start their own mpiexec jobs: run them only in the plain pass.
    if config.getoption("--with-mpi", default=False):
        skip = pytest.mark.skip(reason="launcher tests run in the plain (non-MPI) pytest pass")
        for item in items:
            if "launcher" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def comm():
    """``MPI.COMM_WORLD`` (size 1 in the singleton pass)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def shared_folder(comm):
    """A temporary folder every rank of ``comm`` sees (root makes it), removed after the test."""
    import shutil
    import tempfile
    from pathlib import Path

    made = tempfile.mkdtemp(prefix="mpisync-test-") if comm.rank == 0 else None
    folder = Path(comm.bcast(made, root=0))  # test-side only; mpisync itself never pickles
    yield folder
    comm.Barrier()  # no rank is still reading it
    if comm.rank == 0:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def bounded_env():
    """Environment for an ``mpiexec`` started by a test: bounded, and on the embedded MPI."""
    env = dict(os.environ)
    env.setdefault("MPIEXEC_TIMEOUT", "120")
    env.setdefault("HYDRA_LAUNCHER", "fork")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    for name in list(env):  # a nested launch must not inherit this job's process-manager wiring
        if name.startswith(("PMI_", "PMIX_", "OMPI_COMM_WORLD", "HYDI_", "MPIR_CVAR_CH4_")):
            del env[name]
    return env
