"""A rank that never joins an all-reduce ends the job with a diagnostic within a bound, never a hang."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOB = Path(__file__).parent / "jobs" / "allreduce_faults.py"


def _run(env, kind, timeout=150):
    cmd = ["mpiexec", "-n", "2", sys.executable, str(JOB), kind]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr, time.monotonic() - start


def test_gradsync_missing_rank_aborts_with_diagnostic(bounded_env):
    proc, out, seconds = _run(bounded_env, "gradsync")
    assert proc.returncode != 0, out
    assert "SyncTimeoutError: mpisync: rank 0 of 2: the all-reduce validation did not complete within 3 s" in out, out
    assert "'layer0.weight'" in out and "aborts the job" in out, out
    assert "finished" not in out
    assert seconds < 50, f"the job took {seconds:.1f} s to end"


def test_backend_missing_rank_aborts_with_diagnostic(bounded_env):
    pytest.importorskip("torch")
    proc, out, seconds = _run(bounded_env, "backend")
    assert proc.returncode != 0, out
    assert "SyncTimeoutError: mpisync: rank 0 of 2: the torch.distributed operation did not complete" in out, out
    assert "pending: 'all_reduce'" in out and "aborts the job" in out, out
    assert "finished" not in out
    assert seconds < 50, f"the job took {seconds:.1f} s to end"


def test_backend_missing_rank_raises_when_asked(bounded_env):
    pytest.importorskip("torch")
    proc, out, seconds = _run(dict(bounded_env, MPISYNC_TIMEOUT_ABORT="0"), "backend-raise")
    assert proc.returncode != 0, out
    assert "rank 0 raised" in out and "did not complete within 3 s" in out, out
    assert seconds < 50, f"the job took {seconds:.1f} s to end"
