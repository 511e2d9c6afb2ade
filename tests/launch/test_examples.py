"""The examples run as users run them: the training script, the Slurm and PBS scripts, and
smoke runs of the benchmark scripts under benchmarks/.

The batch scripts run under bash with stand-ins for ``srun`` and ``mpirun``
that start the same command with this machine's ``mpiexec`` (2 ranks).
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cliutil import ONE_SMALL_ITERATION

pytestmark = pytest.mark.launcher
ROOT = Path(__file__).resolve().parents[2]
torch = pytest.importorskip("torch")

SRUN = """#!/bin/bash
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
exec mpiexec -n "${SLURM_NTASKS:-2}" "$@"
"""
MPIRUN = """#!/bin/bash
n=2; args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -np|-n) n=$2; shift 2;;
    -machinefile|-hostfile|--hostfile) shift 2;;
    *) args+=("$1"); shift;;
  esac
done
exec mpiexec -n "$n" "${args[@]}"
"""


def _run(cmd, env, timeout=240):
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_train_then_resume_on_more_ranks(bounded_env, tmp_path):
    ckpt = tmp_path / "ckpt.npz"
    first = _run(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
            "examples/train_resume.py",
            "--steps",
            "5",
            "--save",
            str(ckpt),
        ],
        bounded_env,
    )
    assert first.count("identical on every rank: True") == 2 and ckpt.exists()
    saved = [
        line.split("state ")[-1].split(";")[0]
        for line in first.splitlines()
        if "after 5 steps" in line
    ][0]
    second = _run(
        [
            "mpiexec",
            "-n",
            "3",
            sys.executable,
            "examples/train_resume.py",
            "--steps",
            "5",
            "--resume",
            str(ckpt),
        ],
        bounded_env,
    )
    # every rank starts from the checkpoint's state
    assert second.count(f"synced state {saved}") == 3
    assert second.count("identical on every rank: True") == 3


@pytest.mark.parametrize(
    "script,launcher", [("slurm_train.sbatch", "srun"), ("pbs_train.sh", "mpirun")]
)
def test_batch_script_fresh_then_staged_resume(bounded_env, tmp_path, script, launcher):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / launcher
    fake.write_text(SRUN if launcher == "srun" else MPIRUN)
    fake.chmod(0o755)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\nlocalhost\n")
    env = dict(
        bounded_env,
        PATH=f"{bin_dir}{os.pathsep}{bounded_env['PATH']}",
        VENV=sys.prefix,
        STEPS="3",
        CKPT=str(tmp_path / "shared" / "latest.npz"),
        LOCAL_DIR=str(tmp_path / "local"),
        SLURM_NTASKS="2",
        SLURM_JOB_ID="42",
        PBS_NODEFILE=str(nodefile),
        PBS_JOBID="42",
    )
    fresh = _run(["bash", f"examples/{script}"], env)
    assert fresh.count("fresh start") == 2 and "saved" in fresh
    resumed = _run(["bash", f"examples/{script}"], env)
    assert "mpisync stage-checkpoint:" in resumed and "verified" in resumed
    assert (
        resumed.count("resumed from") == 2 and resumed.count("identical on every rank: True") == 2
    )
    assert (tmp_path / "local" / "mpisync-42" / "latest.npz").exists()


def test_ddp_parts_prints_every_part_and_the_bounds(bounded_env):
    out = _run(
        ["mpiexec", "-n", "2", sys.executable, "benchmarks/ddp_parts.py", "--iterations", "1"],
        bounded_env,
    )
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines() if line.endswith(" ms")}
    assert set(rows) == {
        "no communication",
        "DDP, no-op hook",
        "mpisync",
        "gloo",
        "step, then the all_reduces",
        "the all_reduces alone",
    }, out
    assert all(float(line.split()[-2]) > 0 for line in rows.values()), out
    assert (
        "33.6 MB of gradients in 2 all_reduces" in out
        and "compute/step with free communication" in out
    ), out


def test_allreduce_sizes_prints_both_ways_at_each_size(bounded_env):
    out = _run(
        [
            "mpiexec",
            "-n",
            "2",
            sys.executable,
            "benchmarks/allreduce_sizes.py",
            "--sizes",
            "0.5",
            "3",
            "--piece",
            "1",
            "--iterations",
            "1",
        ],
        bounded_env,
    )
    rows = re.findall(
        r"^ +(\S+) MiB +one +(\S+) ms .* pieces +(\S+) ms +one/pieces +(\S+)$", out, re.M
    )
    assert [row[0] for row in rows] == ["0.5", "3"], out
    assert all(float(value) > 0 for row in rows for value in row[1:]), out
    assert "pieces of 1 MiB" in out, out


def test_side_by_side_gives_every_row_of_both_checkouts(bounded_env):
    # The same checkout twice: every row is timed for both, and the ratio is printed.
    out = _run(
        [
            sys.executable,
            "benchmarks/side_by_side.py",
            str(ROOT),
            str(ROOT),
            "--rounds",
            "1",
            "--",
            "--quick",
            "--osu-max",
            "4",
            "--osu-scale",
            "0.01",
            "--no-ibcast",
            "--no-sweep",
            *ONE_SMALL_ITERATION,
        ],
        bounded_env,
    )
    rows = [line.split() for line in out.splitlines() if line.startswith("many-small: ")]
    assert len(rows) >= 5 and all(float(row[-1]) > 0 for row in rows), out
    assert any("ParamSync" in " ".join(row) for row in rows), out
    # the raw MPI rows of every operation, each size its own row
    raw = {" ".join(line.split()[:3]) for line in out.splitlines() if line.startswith("osu ")}
    assert raw == {
        "osu bcast 1",
        "osu bcast 2",
        "osu bcast 4",
        "osu allreduce 4",
        "osu reduce 4",
        "osu allgather 1",
        "osu allgather 2",
        "osu allgather 4",
    }, out
