"""mpisync never touches a user's own MPI traffic: a plain mpi4py master/worker program whose
only change is ``import mpisync`` (and one sync) receives exactly its workers' results with
``source=ANY_SOURCE, tag=ANY_TAG`` on ``MPI.COMM_WORLD``, though workers end their scripts (and
send mpisync's departure notes) while the master still receives (jobs/user_traffic.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOB = Path(__file__).parent / "jobs" / "user_traffic.py"


def test_departure_notes_never_reach_a_users_any_source_any_tag_receive(bounded_env):
    cmd = ["mpiexec", "-n", "4", sys.executable, str(JOB)]
    proc = subprocess.run(cmd, env=bounded_env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    expected = [(rank, f"result of {rank}") for rank in (1, 2, 3)]
    assert f"got {expected}" in out, out
    assert "UnpicklingError" not in out and "pending" not in out, out
