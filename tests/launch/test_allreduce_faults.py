"""Jobs with their own mpiexec: the DDP example (plain and through its Slurm script), and a rank
that never joins an all-reduce, which ends the job with a diagnostic within a bound, never a
hang."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).parent / "jobs" / "allreduce_faults.py"
SRUN = """#!/bin/bash
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
exec mpiexec -n "${SLURM_NTASKS:-2}" "$@"
"""


def _run_from_the_repo(cmd, env, timeout=240) -> subprocess.CompletedProcess:
    """``cmd`` run from the repository's root, which succeeded."""
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_ddp_example_under_mpiexec(bounded_env):
    pytest.importorskip("torch")
    proc = _run_from_the_repo(
        ["mpiexec", "-n", "3", sys.executable, "examples/ddp_train.py", "--steps", "6"], bounded_env
    )
    assert proc.stdout.count("weights identical on every rank: True") == 3, proc.stdout
    assert "step 6: loss" in proc.stdout


def test_ddp_slurm_script(bounded_env, tmp_path):
    pytest.importorskip("torch")
    fake = tmp_path / "srun"
    fake.write_text(SRUN)
    fake.chmod(0o755)
    env = dict(
        bounded_env,
        PATH=f"{tmp_path}:{bounded_env['PATH']}",
        STEPS="3",
        SLURM_NTASKS="2",
        VENV=str(Path(sys.executable).parent.parent),
    )
    proc = _run_from_the_repo(["bash", "examples/slurm_ddp.sbatch"], env)
    assert proc.stdout.count("weights identical on every rank: True") == 2, proc.stdout


def _run(env, kind, timeout=150):
    cmd = ["mpiexec", "-n", "2", sys.executable, str(JOB), kind]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, proc.stdout + proc.stderr, time.monotonic() - start


def _aborted_with(proc, out: str, seconds: float, diagnostic: str) -> None:
    """The job ended by the timeout's abort within the bound, with ``diagnostic`` printed."""
    assert proc.returncode != 0, out
    assert diagnostic in out and "aborts the job" in out, out
    assert "finished" not in out
    assert seconds < 50, f"the job took {seconds:.1f} s to end"


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_backend_at_each_thread_level(bounded_env, level):
    # Below MPI_THREAD_MULTIPLE no progress thread calls MPI: operations complete on the caller's
    # thread.
    pytest.importorskip("torch")
    proc, out, _ = _run(dict(bounded_env, MPI4PY_RC_THREAD_LEVEL=level), "thread-level")
    assert proc.returncode == 0, out
    threaded = level == "multiple"
    assert out.count(f"threaded {threaded}, correct True") == 2, out


def test_backend_with_torch_rendezvous(bounded_env):
    pytest.importorskip("torch")
    proc, out, _ = _run(bounded_env, "torch-rendezvous")
    assert proc.returncode == 0, out
    assert out.count("backend mpisync, max [1.0, 1.0, 1.0, 1.0]") == 2, out


def test_gradsync_missing_rank_aborts_with_diagnostic(bounded_env):
    proc, out, seconds = _run(bounded_env, "gradsync")
    assert "'layer0.weight'" in out, out
    _aborted_with(
        proc,
        out,
        seconds,
        "SyncTimeoutError: mpisync: rank 0 of 2: the all-reduce validation did not complete within "
        "3 s",
    )


def test_gradsync_rank_out_of_the_collectives_names_what_was_in_flight(bounded_env):
    # The pending names come from the reduce transport's ring (transports.base.pending_names):
    # the one collective in flight, not every name of the set.
    proc, out, seconds = _run(bounded_env, "gradsync-stall")
    assert "'b.small'" not in out, out
    _aborted_with(
        proc,
        out,
        seconds,
        "SyncTimeoutError: mpisync: rank 0 of 2: the all-reduce collectives did not complete "
        "within 3 s (timed out); pending: 'a.big'.",
    )


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_backend_missing_rank_aborts_with_diagnostic(bounded_env, level):
    # serialized: no progress thread nor watchdog; the caller's own wait has the deadline.
    pytest.importorskip("torch")
    proc, out, seconds = _run(dict(bounded_env, MPI4PY_RC_THREAD_LEVEL=level), "backend")
    assert "pending: 'all_reduce'" in out, out
    _aborted_with(
        proc,
        out,
        seconds,
        "SyncTimeoutError: mpisync: rank 0 of 2: the torch.distributed operation did not complete",
    )


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_backend_missing_rank_raises_when_asked(bounded_env, level):
    pytest.importorskip("torch")
    env = dict(bounded_env, MPISYNC_TIMEOUT_ABORT="0", MPI4PY_RC_THREAD_LEVEL=level)
    proc, out, seconds = _run(env, "backend-raise")
    assert proc.returncode != 0, out
    assert "rank 0 raised" in out and "did not complete within 3 s" in out, out
    assert seconds < 50, f"the job took {seconds:.1f} s to end"


def test_bench_smoke(bounded_env):
    pytest.importorskip("torch")
    proc = _run_from_the_repo(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
            "-m",
            "mpisync.tools.bench.allreduce",
            "--max-bytes",
            "1024",
            "--iterations",
            "2",
            "--sets",
            "many-small",
            "--json",
        ],
        bounded_env,
        timeout=300,
    )
    import json

    result = json.loads(proc.stdout)
    assert [row["bytes"] for row in result["sweep"]] == [4, 16, 64, 256, 1024]
    assert (
        result["grads"][0]["workload"] == "many-small" and result["grads"][0]["vs_per_tensor"] > 0
    )
    assert result["ddp"]["mpisync_ms"] > 0 and result["ddp"]["gloo_ms"] > 0
    # every collective beside gloo at the sizes within --max-bytes (here 1 KiB), and the check
    from mpisync.tools.bench.collectives import COLLECTIVES, LIMITS

    assert [(r["collective"], r["bytes"]) for r in result["collectives"]] == [
        (name, 0 if name == "barrier" else 1024) for name in COLLECTIVES
    ]
    assert all(r["mpisync_us"] > 0 and r["gloo/mpisync"] > 0 for r in result["collectives"])
    limited = [r for r in result["collectives"] if r["collective"] in LIMITS]
    assert len(limited) == 8 and all(r["limit_us"] > 0 and r["of_limit"] > 0 for r in limited)
    assert [r["bytes"] for r in result["check"]] == [1024]
