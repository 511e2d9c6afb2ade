"""Faults: a killed, stalled or failing rank ends the job within a bound, never a hang.

Bounds are generous (the machine is shared); each measures the whole mpiexec run.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOB = Path(__file__).parent / "jobs" / "faults.py"


def _run(env, kind, *python_args, timeout=120):
    cmd = ["mpiexec", "-n", "3", sys.executable, *python_args, str(JOB), kind]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.parametrize("kind", ["kill-rank", "kill-root"])
def test_killed_rank_ends_the_job(bounded_env, kind):
    proc, out, seconds = _run(bounded_env, kind)
    assert proc.returncode != 0, out
    assert "finished" not in out
    assert seconds < 60, f"{kind}: the job took {seconds:.1f} s to end"


@pytest.mark.parametrize("memory", ["host", "device", "host, cross-memory"])
def test_stalled_rank_times_out_with_pending_parameters_then_aborts(bounded_env, memory):
    env = dict(
        bounded_env,
        FAULT_TIMEOUT="3",
        FAULT_DEVICE="1" if memory == "device" else "0",
        FAULT_CROSS="1" if "cross" in memory else "0",
    )
    proc, out, seconds = _run(env, "stall")
    assert proc.returncode != 0, out
    assert "SyncTimeoutError: mpisync: rank" in out and "did not complete within 3 s" in out, out
    if memory == "device":
        assert (
            "the device broadcast did not complete" in out
            or "the validation exchange did not" in out
        ), out
    # the victim stopped after its copies: the others wait in the all-reduce after them
    if "cross" in memory:
        assert (
            "rank 0 of 3: the cross-memory copies did not complete" in out
            and "'layer0.weight'" in out
        ), out
    assert "pending parameter(s): 'layer" in out
    assert "aborts the job" in out
    assert seconds < 3 + 45, f"abort took {seconds:.1f} s"


def test_exception_between_syncs_ends_the_job_at_once(bounded_env):
    # Plain python, the default: the failing rank's uncaught exception aborts the job
    # (mpisync._runtime.failfast); nobody waits out the 60 s timeout.
    env = dict(bounded_env, FAULT_TIMEOUT="60")
    proc, out, seconds = _run(env, "raise-between")
    assert proc.returncode != 0, out
    assert "RuntimeError: rank 1 failed between two syncs" in out
    assert "mpisync: rank 1 of 3 ended with an uncaught RuntimeError; aborting the job" in out
    assert "SyncTimeoutError" not in out and "finished" not in out, out
    assert seconds < 30, f"took {seconds:.1f} s; the 60 s timeout should not have been needed"


def test_exception_between_syncs_is_caught_by_the_timeout_with_fail_fast_off(bounded_env):
    # MPISYNC_FAIL_FAST=0: the failing rank finalizes MPI on exit, and its exit note is off too;
    # the others wait in the next sync until the timeout reports it and aborts.
    env = dict(bounded_env, FAULT_TIMEOUT="3", MPISYNC_FAIL_FAST="0")
    proc, out, seconds = _run(env, "raise-between")
    assert proc.returncode != 0, out
    assert "RuntimeError: rank 1 failed between two syncs" in out
    assert "SyncTimeoutError" in out and "validation exchange did not complete within 3 s" in out, (
        out
    )
    assert "finished" not in out
    assert seconds < 3 + 45


def test_exception_between_syncs_under_python_m_mpi4py_aborts_at_once(bounded_env):
    env = dict(bounded_env, FAULT_TIMEOUT="60")
    proc, out, seconds = _run(env, "raise-between", "-m", "mpi4py")
    assert proc.returncode != 0, out
    assert "RuntimeError: rank 1 failed between two syncs" in out
    assert "SyncTimeoutError" not in out
    assert seconds < 30, f"took {seconds:.1f} s; the 60 s timeout should not have been needed"
