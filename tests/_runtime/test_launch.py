"""The launch check: a world of one process where the launcher started more is refused at the first
sync of every entry point, naming the launcher and the fix; MPISYNC_ALLOW_SINGLETON=1 allows it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpisync._runtime.launch import launch_problem, launch_status, started_by

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env,launcher,fix",
    [
        (
            {"WORLD_SIZE": "2", "RANK": "1", "TORCHELASTIC_RUN_ID": "x"},
            "torchrun started it as one of 2 processes (WORLD_SIZE=2)",
            "launch with `mpiexec -n 2 python ...`",
        ),
        (
            {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4"},
            "srun without an MPI plugin started it as one of 4 processes (SLURM_STEP_NUM_TASKS=4)",
            "Launch with `srun --mpi=pmi2 ...`",
        ),
        (
            {"SLURM_STEP_ID": "0", "SLURM_NPROCS": "3"},
            "srun without an MPI plugin started it as one of 3 processes (SLURM_NPROCS=3)",
            "or with `mpiexec -n 3` inside the allocation",
        ),
        (
            {"PMI_SIZE": "2", "PMI_RANK": "0"},
            "an MPI launcher speaking PMI (mpiexec, srun --mpi=pmi2, ...) started it as one of 2 "
            "processes (PMI_SIZE=2)",
            "Launch with the mpiexec of the MPI library mpi4py loaded",
        ),
        (
            {"OMPI_COMM_WORLD_SIZE": "8"},
            "Open MPI's mpirun started it as one of 8 processes (OMPI_COMM_WORLD_SIZE=8)",
            "Launch with the mpiexec of the MPI library mpi4py loaded",
        ),
        (
            {"PMIX_RANK": "3"},
            "a PMIx launcher (prterun, srun --mpi=pmix, ...) started it as rank 3 of at least 4 "
            "(PMIX_RANK=3)",
            "mpiexec",
        ),
        (
            {"HOROVOD_SIZE": "2"},
            "horovodrun with Gloo started it as one of 2 processes (HOROVOD_SIZE=2)",
            "launch a Horovod script with `mpiexec -n 2 python -m mpisync.horovod train.py`",
        ),
    ],
)
def test_each_launcher_is_named_with_its_fix(env, launcher, fix):
    problem = launch_problem(1, env)
    assert problem.startswith(
        "mpisync: this process is alone in its MPI world (MPI.COMM_WORLD has 1 process), but "
        + launcher
    ), problem
    assert fix in problem and problem.endswith("set MPISYNC_ALLOW_SINGLETON=1.")
    assert launch_problem(2, env) == ""  # a world of several processes: never


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_JOB_ID": "7"},  # the batch script itself
        {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"},  # srun -n 1
        # mpiexec -n 1 inside a Slurm step of 4 tasks: the MPI launcher's own count decides
        {"PMI_SIZE": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"},
        {"OMPI_COMM_WORLD_SIZE": "1", "WORLD_SIZE": "4"},
        {"PMIX_RANK": "0"},  # rank 0 of a PMIx launch says nothing about the others
        {"WORLD_SIZE": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"},  # innermost: 1
        {"WORLD_SIZE": "two"},  # not a number: no evidence
    ],
)
def test_no_mismatch_without_evidence_of_more_processes(env):
    assert started_by(env) is None and launch_problem(1, env) == ""


def test_info_line(monkeypatch):
    monkeypatch.delenv("MPISYNC_ALLOW_SINGLETON", raising=False)
    env = {"WORLD_SIZE": "2"}
    assert launch_status(1, env).startswith(
        "MISMATCH, every sync raises: this process is alone in its MPI world"
    )
    assert "a torch launcher (WORLD_SIZE set) started it" in launch_status(1, env)
    assert launch_status(4, env) == "ok: one MPI world of 4 processes"
    assert launch_status(1, {}) == "ok: one process, no launcher that started more"
    monkeypatch.setenv("MPISYNC_ALLOW_SINGLETON", "1")
    assert launch_status(1, env).startswith("allowed by MPISYNC_ALLOW_SINGLETON=1: this process")


ENTRY_POINTS = """
import numpy as np, torch, mpisync
from mpisync.horovod import broadcast_optimizer_state
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
calls = {
    "sync_params": lambda: mpisync.sync_params({"w": np.zeros(3)}),
    "ParamSync": lambda: mpisync.ParamSync().sync({"w": np.zeros(3)}),
    "allreduce": lambda: mpisync.allreduce({"w": np.zeros(3)}),
    "GradSync": lambda: mpisync.GradSync().allreduce({"w": np.zeros(3)}),
    "sync_state": lambda: mpisync.sync_state({"w": np.zeros(3), "step": 1}),
    "broadcast_parameters": lambda: mpisync.broadcast_parameters(model.state_dict(), root_rank=0),
    "broadcast_optimizer_state": lambda: broadcast_optimizer_state(opt, root_rank=0),
    "hvd.init": lambda: __import__("mpisync.horovod", fromlist=["init"]).init(),
    "torch.init_process_group": lambda: (
        __import__("mpisync.torch", fromlist=["init_process_group"]).init_process_group(),
        torch.distributed.destroy_process_group(),
    ),
}
for name, call in calls.items():
    try:
        call()
        print(name, "ran")
    except mpisync.InvalidParamError as exc:
        print(name, "refused:", str(exc).split(" but ")[1].split(":")[0])
"""


ENTRY_NAMES = (
    "sync_params",
    "ParamSync",
    "allreduce",
    "GradSync",
    "sync_state",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "hvd.init",
    "torch.init_process_group",
)


def _singleton(env_extra: dict) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDI_", "MPISYNC_ALLOW"))
    }
    env.update(env_extra, PYTHONPATH=f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}")
    return subprocess.run(
        [sys.executable, "-c", ENTRY_POINTS], env=env, capture_output=True, text=True, timeout=120
    )


def test_every_entry_point_refuses_a_world_of_one_under_srun_without_mpi():
    pytest.importorskip("torch")
    proc = _singleton({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"})
    assert proc.returncode == 0, proc.stderr
    refused = (
        "refused: srun without an MPI plugin started it as one of 2 processes "
        "(SLURM_STEP_NUM_TASKS=2)"
    )
    lines = proc.stdout.splitlines()
    assert lines == [f"{name} {refused}" for name in ENTRY_NAMES], proc.stdout


def test_allowed_on_purpose_and_silent_without_a_launcher():
    pytest.importorskip("torch")
    allowed = _singleton({"WORLD_SIZE": "2", "MPISYNC_ALLOW_SINGLETON": "1"})
    plain = _singleton({})
    for proc in (allowed, plain):
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [w for name in ENTRY_NAMES for w in (name, "ran")], (
            proc.stdout
        )


@pytest.mark.launcher
def test_a_real_mpi_world_is_never_refused(bounded_env):
    # WORLD_SIZE (say, left over from an outer launcher) beside a world of 2; and mpiexec -n 1 in a
    # Slurm step of 4 tasks (PMI_SIZE=1 is the launcher's own count): both sync.
    code = "import numpy, mpisync; print(mpisync.sync_params({'w': numpy.zeros(3)}).transport)"
    for n, extra in (
        (2, {"WORLD_SIZE": "4"}),
        (1, {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}),
    ):
        env = dict(bounded_env, **extra)
        proc = subprocess.run(
            ["mpiexec", "-n", str(n), sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # (two ranks' lines may share a line of the launcher's output)
        assert proc.stdout.count("host") == (2 if n == 2 else 0), proc.stdout
        assert proc.stdout.count("local") == (0 if n == 2 else 1), proc.stdout
