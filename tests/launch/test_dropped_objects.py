"""Syncers dropped without ``close()`` release what they hold when collected; a communicator that
MPI cannot duplicate any more is one ``SyncError`` on every rank; a setting invalid in one rank's
environment only is refused on every rank.

Each case is a 2-rank job whose rank 0 prints what every rank saw.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.launcher
JOBS = Path(__file__).parent / "jobs"


def _run(env, job, *args, timeout=400):
    cmd = ["mpiexec", "-n", "2", sys.executable, str(JOBS / job), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return proc.stdout, out


def test_thousands_of_dropped_syncers_are_flat_in_fds_mappings_and_memory(bounded_env):
    # 3000 of each: more than MPICH's 2048 communicator context ids, so a duplicate never freed
    # would end the loop with an MPI error
    env = dict(bounded_env, MPIEXEC_TIMEOUT="380")
    stdout, out = _run(env, "dropped_objects.py", "drop", "3000")
    rows = re.findall(
        r"^(ParamSync|GradSync) rank (\d): fds (\d+) (\d+) maps (\d+) (\d+) rss (\d+) (\d+)$",
        stdout,
        re.M,
    )
    assert sorted((kind, rank) for kind, rank, *_ in rows) == [
        ("GradSync", "0"),
        ("GradSync", "1"),
        ("ParamSync", "0"),
        ("ParamSync", "1"),
    ], out
    for kind, rank, *figures in rows:
        fds0, fds1, maps0, maps1, rss0, rss1 = map(int, figures)
        assert fds1 == fds0, (kind, rank, out)
        assert maps1 == maps0, (kind, rank, out)
        # leaking one object's arena (hundreds of KiB) 3000 times would show in GiB
        assert rss1 - rss0 < 32 << 10, (kind, rank, out)


def test_no_context_id_left_is_a_sync_error_on_every_rank_then_recovers(bounded_env):
    stdout, out = _run(bounded_env, "dropped_objects.py", "exhausted", timeout=120)
    lines = dict(re.findall(r"^rank (\d): (.*)$", stdout, re.M))
    assert sorted(lines) == ["0", "1"], out
    refusal = (
        "SyncError: mpisync: MPI could not duplicate the communicator (Other MPI error): its "
        "communicator context ids are most likely used up"
    )
    for line in lines.values():
        assert f"sync: {refusal}" in line and f"allreduce: {refusal}" in line, out
        assert line.endswith("after: True"), out  # once the caller freed its duplicates


@pytest.mark.parametrize(
    "name, value",
    [("MPISYNC_CROSS_MEMORY", "nope"), ("MPISYNC_MAX_CONCURRENT", "0")],
)
def test_a_setting_invalid_on_one_rank_only_is_refused_on_every_rank(bounded_env, name, value):
    stdout, out = _run(bounded_env, "one_rank_setting.py", name, value, timeout=120)
    rows = re.findall(r"^rank (\d) (ParamSync|GradSync): (\w+): (.*) \(([\d.]+) s\)$", stdout, re.M)
    assert len(rows) == 4, out
    for _, _kind, error, message, seconds in rows:
        assert error == "InvalidParamError" and name in message, out
        assert float(seconds) < 30, out  # agreed at once: nobody waits out the 60 s timeout
    for kind in ("ParamSync", "GradSync"):  # the same message on both ranks
        assert len({message for _, k, _, message, _ in rows if k == kind}) == 1, out
