"""Unit tests of mpisync._runtime.abort: the abort that ends a timed-out (or failed) job is
itself bounded."""

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.launcher  # each starts a process of its own: the plain pass runs them

# A communicator whose Abort never returns control, as MPI_Abort sometimes did under the embedded
# MPICH with the fork launcher: the process must still end, killed by its own alarm.
STUCK_ABORT = """
import time
import mpisync._runtime.abort as abort

class StuckAbort:
    def Abort(self, code):
        time.sleep(60)

abort._ABORT_BOUND_SECONDS = 1
abort.abort_job(StuckAbort())
print("abort_job returned")
"""


def test_abort_job_ends_the_process_when_abort_does_not(bounded_env):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", STUCK_ABORT],
        env=bounded_env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == -signal.SIGALRM, (proc.returncode, proc.stdout, proc.stderr)
    assert "abort_job returned" not in proc.stdout
    assert time.monotonic() - start < 30


def test_abort_job_leaves_a_handler_the_program_installed_alone(bounded_env):
    # A program that handles SIGALRM itself keeps its handler and its alarm: no bound is set.
    program = STUCK_ABORT.replace(
        "abort.abort_job",
        "import signal\n"
        "signal.signal(signal.SIGALRM, lambda *a: print('own handler', flush=True))\n"
        "signal.alarm(0)\nabort.abort_job",
    ).replace("time.sleep(60)", "time.sleep(3)")
    proc = subprocess.run(
        [sys.executable, "-c", program], env=bounded_env, capture_output=True, text=True, timeout=50
    )
    assert proc.returncode == 0 and "own handler" not in proc.stdout, proc.stdout + proc.stderr
    assert "abort_job returned" in proc.stdout
