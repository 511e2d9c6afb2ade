"""One rank fails outside mpisync's calls: the whole job ends within seconds, that rank's
traceback first, with the default timeout (300 s) in force (jobs/failfast.py)."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOB = Path(__file__).parent / "jobs" / "failfast.py"
# from the failure to the job's end (the bound); the start, torch's import among it,
# takes seconds of its own on a busy 2-core machine and is not counted
BOUND_SECONDS = 10
FAILS_AT = re.compile(r"rank \d+ fails at (\d+\.\d+)")


def _run(env, kind, ranks=2):
    """The job's result, its output, and the seconds from the failing rank's failure (its
    ``fails at`` line; infinite without one) to the job's end."""
    env = dict(env)
    env.pop("MPISYNC_TIMEOUT", None)  # the default, 300 s: nobody may wait it out
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, str(JOB), kind]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    ended, out = time.time(), proc.stdout + proc.stderr
    failed = FAILS_AT.search(out)
    return proc, out, ended - float(failed.group(1)) if failed else float("inf")


@pytest.mark.parametrize("ranks", [2, 3])
def test_an_uncaught_exception_on_one_rank_ends_the_job_traceback_first(bounded_env, ranks):
    proc, out, seconds = _run(bounded_env, "raise", ranks)
    assert proc.returncode != 0, out
    last = ranks - 1
    traceback = out.index(f"ValueError: a bug on rank {last} only")
    summary = out.index(
        f"mpisync: rank {last} of {ranks} ended with an uncaught ValueError; aborting the job"
    )
    assert out.index("Traceback (most recent call last)") < traceback < summary, out
    assert "finished" not in out and "timed out" not in out, out
    assert seconds < BOUND_SECONDS, f"the job ended {seconds:.1f} s after the failure:\n{out}"


@pytest.mark.parametrize("kind", ["mismatch", "mismatch-torch"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_an_error_raised_on_every_rank_prints_its_traceback_once(bounded_env, ranks, kind):
    """The same uncaught ManifestMismatchError on every rank: rank 0 prints the traceback and
    the message, every other rank one line pointing there; the job ends with it."""
    proc, out, _ = _run(bounded_env, kind, ranks)
    assert proc.returncode != 0, out
    assert out.count("Traceback (most recent call last)") == 1, out
    assert out.count("ManifestMismatchError: mpisync: parameters differ from root rank 0") == 1
    for rank in range(1, ranks):
        assert (
            f"mpisync: rank {rank}: ManifestMismatchError, the same error every rank raised: "
            "rank 0 prints its message and traceback" in out
        ), out
    assert "ended with an uncaught ManifestMismatchError; aborting the job" in out, out


def test_ddp_with_a_shape_mismatch_ends_the_job_with_torchs_error(bounded_env):
    pytest.importorskip("torch")
    proc, out, seconds = _run(bounded_env, "ddp-shape")
    assert proc.returncode != 0, out
    # torch's own check, through torch's own hook (which prefixes each line with the rank)
    check = out.index("[rank1]: RuntimeError: [1]: params[0] in this process with sizes [3, 4]")
    summary = out.index("[rank1]: mpisync: rank 1 of 2 ended with an uncaught RuntimeError")
    assert check < summary, out
    assert "finished" not in out and "timed out" not in out, out
    assert seconds < BOUND_SECONDS, f"the job ended {seconds:.1f} s after the failure:\n{out}"


@pytest.mark.parametrize(
    "kind, phase",
    [
        ("exit", "the communicator duplication cannot complete"),
        ("exit-gradsync", "the all-reduce validation cannot complete"),
        ("exit-torch", "the torch.distributed operation cannot complete"),
    ],
)
def test_a_rank_that_exits_while_others_wait_ends_the_job(bounded_env, kind, phase):
    if kind == "exit-torch":
        pytest.importorskip("torch")
    proc, out, seconds = _run(bounded_env, kind)
    assert proc.returncode != 0, out
    leaves = out.index("rank 1 leaves early")
    said = out.index(
        f"PeerExitedError: mpisync: rank 0 of 2: {phase}: rank 1 of this communicator has "
        "already ended its script"
    )
    assert leaves < said and "rank 0 aborts the job" in out, out
    assert "finished" not in out and "timed out" not in out, out
    assert seconds < BOUND_SECONDS, f"the job ended {seconds:.1f} s after the failure:\n{out}"


def test_a_rank_that_exits_raises_peer_exited_when_aborts_are_off(bounded_env):
    proc, out, seconds = _run(dict(bounded_env, MPISYNC_TIMEOUT_ABORT="0"), "exit", ranks=3)
    assert proc.returncode != 0, out
    # the first rank to raise ends its process, and the launcher the job: one line at least
    lines = [x for x in out.splitlines() if x.startswith(("rank 0 raised", "rank 1 raised"))]
    assert lines, out
    for line in lines:
        assert "PeerExitedError" in line and "rank 2 of this communicator has" in line, out
    assert seconds < BOUND_SECONDS, f"the job ended {seconds:.1f} s after the failure:\n{out}"


def test_a_rank_that_exits_is_no_error_for_a_communicator_without_it(bounded_env):
    proc, out, _ = _run(bounded_env, "exit-unrelated", ranks=3)
    assert proc.returncode == 0, out
    assert "rank 0 finished" in out and "rank 1 finished" in out, out


def test_fail_fast_off_leaves_the_wait_to_the_timeout(bounded_env):
    env = dict(bounded_env, MPISYNC_FAIL_FAST="0")
    cmd = ["mpiexec", "-n", "2", sys.executable, str(JOB), "raise"]
    proc = subprocess.run(
        cmd, env=dict(env, MPISYNC_TIMEOUT="3"), capture_output=True, text=True, timeout=120
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "ValueError: a bug on rank 1 only" in out, out
    assert "ended with an uncaught" not in out, out
    assert "did not complete within 3 s (timed out)" in out, out


def test_a_rank_that_finalizes_mpi_itself_ends_the_others_wait_within_seconds(bounded_env):
    """Rank 1 calls ``MPI.Finalize()`` while rank 0 waits for it in ``sync_params``: the note
    goes out from inside ``MPI_Finalize``, and nothing of mpisync's stays posted there."""
    job = Path(__file__).parent / "jobs" / "finalize_early.py"
    env = dict(bounded_env, MPISYNC_TIMEOUT_ABORT="0", MPISYNC_TIMEOUT="60")
    cmd = ["mpiexec", "-n", "2", sys.executable, str(job)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    raised = re.search(r"rank 0 raised (\w+) after (\d+\.\d) s: (.*)", out)
    assert raised is not None, out
    assert raised.group(1) == "PeerExitedError", out
    assert "rank 1 of this communicator has already ended its script" in raised.group(3), out
    assert float(raised.group(2)) < 20, out
    # the notes went out from inside MPI_Finalize, the receive is complete, nothing abandoned
    assert "rank 1 at finalize: closed=True receive=None kept=0" in out, out
    assert "pending" not in out.replace("pending parameter(s)", "") and "leak" not in out, out
