"""Jobs started with their own mpiexec: timeouts end in a report and an abort, the CLI works."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOBS = Path(__file__).parent / "jobs"


def _mpiexec(n, args, env, timeout=120):
    cmd = ["mpiexec", "-n", str(n), sys.executable, *args]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


def test_timeout_reports_pending_parameters_then_aborts(bounded_env):
    proc, seconds = _mpiexec(3, [str(JOBS / "straggler.py"), "2"], bounded_env)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert (
        "SyncTimeoutError: mpisync: rank 0 of 3: the communicator duplication did not complete "
        "within 2 s"
        in out
        or "SyncTimeoutError: mpisync: rank 0 of 3: the validation exchange did not complete "
        "within 2 s"
        in out
    ), out
    assert "pending parameter(s): 'decoder.bias', 'encoder.weight'" in out, out
    assert "aborts the job" in out
    assert "finished without error" not in out
    assert seconds < 2 + 25, f"abort took {seconds:.1f} s"  # generous: the machine is shared


def test_timeout_can_raise_instead_of_aborting(bounded_env):
    env = dict(bounded_env, MPISYNC_TIMEOUT_ABORT="0", STRAGGLER_SLEEP="5")
    proc, seconds = _mpiexec(2, [str(JOBS / "straggler.py"), "1.5"], env)
    out = proc.stdout + proc.stderr
    assert "rank 0 raised SyncTimeoutError: mpisync: rank 0 of 2:" in out, out
    assert "'decoder.bias', 'encoder.weight'" in out
    assert seconds < 5 + 25


def test_info_prints_library_thread_level_and_sources(bounded_env):
    env = dict(bounded_env, MPISYNC_FUSION_BYTES="8192")
    proc = subprocess.run(
        [sys.executable, "-m", "mpisync", "info", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["thread_level"].startswith("MPI_THREAD_")
    assert info["mpi_library"] and info["mpi_standard"][0].isdigit()
    assert info["defaults"]["fusion_bytes"] == {
        "value": 8192,
        "source": "environment",
        "env": "MPISYNC_FUSION_BYTES",
    }
    assert info["defaults"]["max_concurrent"]["source"] == "built-in"
    # the PyPI wheels are not CUDA-aware
    assert info["cuda_aware_mpi"] == "no" and "MPIX_" in info["cuda_aware_why"]
    assert info["device_transport"].startswith("staged (")
    assert info["cross_memory"].startswith(
        "off" if env.get("MPISYNC_CROSS_MEMORY") == "0" else "on"
    )
    from mpisync._runtime.speedups import enabled

    built = "on" if enabled(True) else "not built"
    assert info["speedups"].startswith("off" if env.get("MPISYNC_SPEEDUPS") == "0" else built)
    table = subprocess.run(["mpisync", "info"], env=env, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0 and "fusion_bytes    = 8192       (environment" in table.stdout


def test_demo_job_at_two_ranks(bounded_env):
    root = Path(__file__).resolve().parents[2]
    proc, _ = _mpiexec(2, [str(root / "examples" / "sync_demo.py"), "--steps", "2"], bounded_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("identical on every rank: True") == 1, proc.stdout
    before = [
        line.split("before ")[1][:16]
        for line in proc.stdout.splitlines()
        if "digest before" in line
    ]
    after = [
        line.split("after ")[1][:16] for line in proc.stdout.splitlines() if "digest before" in line
    ]
    assert len(before) == 2 and before[0] != before[1] and after == [before[0], before[0]]


def test_debug_log_and_chrome_timeline_per_rank(bounded_env, tmp_path):
    root = Path(__file__).resolve().parents[2]
    env = dict(bounded_env, MPISYNC_LOG="debug", MPISYNC_TIMELINE=str(tmp_path / "tl-{rank}.json"))
    proc, _ = _mpiexec(2, [str(root / "examples" / "sync_demo.py"), "--steps", "2"], env)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        # process-to-process copies (one node, large tensors)
        cross = "over cross-memory" in proc.stderr
        step = "cross-memory: " if cross else "Ibcast 1/"
        assert f"mpisync[rank {rank}] DEBUG {step}" in proc.stderr
        assert f"mpisync[rank {rank}] INFO rank {rank}/2: synced 320 tensors" in proc.stderr
        trace = json.loads((tmp_path / f"tl-{rank}.json").read_text())
        events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        names = {e["name"] for e in events}
        assert {"validate", "broadcast", "verify"} <= names
        assert ("cross-memory" if cross else "pack" if rank == 0 else "unpack") in names
        assert all(e["pid"] == rank and e["dur"] >= 0 for e in events)
        assert sum(e["name"] == "validate" for e in events) == 2  # one per sync
