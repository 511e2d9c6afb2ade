"""Jobs with their own mpiexec: creating a torch process group with a rank that comes late ends
within the group's timeout (never a hang), and torch's own rendezvous works under mpiexec."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOB = Path(__file__).parent / "jobs" / "torch_faults.py"


def _run(env, kind, ranks=2, timeout=120):
    pytest.importorskip("torch")
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, str(JOB), kind]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr, time.monotonic() - start


def test_init_with_a_late_rank_aborts_within_the_timeout(bounded_env):
    proc, out, seconds = _run(bounded_env, "late-init")
    assert proc.returncode != 0, out
    assert "creation of the default process group did not complete within 3 s (timed out)" in out
    assert "aborts the job" in out and "finished" not in out, out
    assert seconds < 8 + 30, f"the job took {seconds:.1f} s to end"


def test_init_with_a_late_rank_raises_when_asked(bounded_env):
    env = dict(bounded_env, MPISYNC_TIMEOUT_ABORT="0")
    proc, out, _ = _run(env, "late-init")
    assert proc.returncode != 0, out
    line = next(line for line in out.splitlines() if line.startswith("rank 0 raised"))
    assert "SyncTimeoutError" in line and "timed out" in line, out
    assert float(line.split(" after ")[1].split(" s")[0]) < 7, line  # the late rank comes at 8 s


def test_new_group_with_a_late_member_raises_on_every_member(bounded_env):
    proc, out, _ = _run(bounded_env, "late-group", ranks=3)
    assert proc.returncode != 0, out
    line = next(line for line in out.splitlines() if line.startswith("rank 0 raised"))
    assert "GroupTimeoutError" in line and "timed out: ranks [2] did not arrive" in line, out
    assert float(line.split(" after ")[1].split(" s")[0]) < 7, line


def test_torch_rendezvous_takes_rank_and_size_from_mpi(bounded_env):
    proc, out, _ = _run(bounded_env, "env", ranks=3)
    assert proc.returncode == 0, out
    for rank in range(3):
        assert f"rank {rank} of 3: backend mpisync, sum [6.0, 6.0, 6.0]" in out, out
