"""The CI scripts' own logic: the Slurm stage's check of the jobs' output (ci/slurm_check.py), and
the GPU check's files in a folder of its own (ci/gpu-check.sh)."""

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("slurm_check", ROOT / "ci" / "slurm_check.py")
slurm_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(slurm_check)


def _train(rank, size, how, start, end, same="True"):
    return (
        f"rank {rank}/{size}: {how}; synced state {start}; after 10 steps loss 1.5000, state "
        f"{end}; identical on every rank: {same}"
    )


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(["mpisync[rank 0] INFO unrelated", *lines, "rank 0: saved x"]) + "\n")
    return str(path)


def test_a_job_on_every_rank_passes(tmp_path, capsys):
    fresh = _write(tmp_path, "f", [_train(r, 4, "fresh start", "aa", "bb") for r in (2, 0, 3, 1)])
    resumed = _write(
        tmp_path, "r", [_train(r, 4, "resumed from /l/x.npz", "bb", "cc") for r in range(4)]
    )
    lines = [
        f"rank {r}/4: 70401 weights identical on every rank: True; digest dd" for r in range(4)
    ]
    # two tasks' output in one line of the job's file: still read
    ddp = _write(tmp_path, "d", ["step 10: loss 1.0 (mean over 4 ranks)" + lines[0], *lines[1:]])
    assert slurm_check.main(["train", "--ranks", "4", fresh, resumed]) == 0
    assert slurm_check.main(["ddp", "--ranks", "4", ddp]) == 0
    out = capsys.readouterr().out
    assert "  fresh: rank 3/4  synced aa  final bb" in out and "  ddp: rank 0/4  final dd" in out
    assert out.count("PASS ") == 3 and "FAIL" not in out


def test_tasks_that_each_ran_alone_fail(tmp_path, capsys):
    # srun without an MPI plugin, before the launch check: 4 worlds of one, each "rank 0/1",
    # each its own model
    alone = _write(tmp_path, "a", [_train(0, 1, "fresh start", "a", f"{r}") for r in range(4)])
    assert slurm_check.main(["train", "--ranks", "4", alone, alone]) == 1
    out = capsys.readouterr().out
    assert "FAIL slurm_train fresh start, 4 ranks" in out
    assert "expected ranks 0..3 once each, got ranks [0, 0, 0, 0]" in out
    assert "expected one world of 4 processes, got world sizes [1]" in out
    assert "end digests differ between ranks: 0, 1, 2, 3" in out


def test_a_resume_that_did_not_start_from_the_saved_state_fails(tmp_path, capsys):
    fresh = _write(tmp_path, "f", [_train(r, 2, "fresh start", "aa", "bb") for r in range(2)])
    resumed = _write(tmp_path, "r", [_train(r, 2, "fresh start", "ee", "cc") for r in range(2)])
    assert slurm_check.main(["train", "--ranks", "2", fresh, resumed]) == 1
    out = capsys.readouterr().out
    assert "PASS slurm_train fresh start" in out and "FAIL slurm_train resumed" in out
    assert "the second job did not resume from the checkpoint" in out
    assert "resumed from state ee, saved bb" in out


def test_gpu_check_writes_into_a_folder_of_its_own(tmp_path):
    # A log name planted in the shared temporary folder (another user's file, or a link to one)
    # is never written through: each run makes its own folder, named after the user.
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    shutil.copy(ROOT / "ci" / "gpu-check.sh", repo / "ci")  # a tree without .whl/: fails at once
    shared = tmp_path / "tmp"
    shared.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("not yours\n")
    for name in ("gpu-check.log", "mpisync-gpu-check-runs", "mpisync-gpu-check"):
        (shared / name).symlink_to(victim)
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env.update(TMPDIR=str(shared), USER="ci-user")
    logs = []
    for _ in range(2):
        proc = subprocess.run(
            ["bash", str(repo / "ci" / "gpu-check.sh"), "--dry-run"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1 and "FAIL install: no wheels in .whl/" in proc.stdout
        logs.append(proc.stdout.strip().splitlines()[-1].removeprefix("gpu-check: log: "))
    assert victim.read_text() == "not yours\n"
    assert logs[0] != logs[1]
    for log in map(Path, logs):
        assert log.parent.parent == shared and log.parent.name.startswith(
            "mpisync-gpu-check-ci-user."
        )
        assert "FAIL install" in log.read_text() and not (log.parent / "prefix").exists()


def test_slurm_stage_says_why_it_skips(tmp_path):
    # No Slurm on PATH and an apt-get that fails (or not root): status 77 and one line saying why,
    # which ci/test.sh turns into "Slurm stage SKIPPED".
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "timeout", "rm", "chmod"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    apt = bin_dir / "apt-get"
    apt.write_text("#!/bin/sh\necho 'E: Unable to locate package slurmctld' >&2\nexit 100\n")
    apt.chmod(0o755)
    proc = subprocess.run(
        [str(bin_dir / "bash"), str(ROOT / "ci" / "slurm.sh")],
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 77, proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1] in (
        "slurm: SKIP: apt-get install slurmctld slurmd slurm-client munge failed (status 100): "
        "no Slurm here",
        "slurm: SKIP: Slurm is not installed and this is not root (apt-get needs root)",
    ), proc.stdout
