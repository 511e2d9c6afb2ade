"""The launch check: one process alone in its MPI world where the launcher started more.

``torchrun --nproc_per_node=2 train.py``, ``srun`` without an MPI plugin (Slurm's default
``MpiDefault=none``), or an ``mpiexec`` of another MPI library than the one mpi4py loaded: each
process starts MPI as a world of one, every sync is local, and every rank trains its own model
without a word. The launcher's environment tells: it says how many processes it started. When
``MPI.COMM_WORLD`` has one process and that environment says more, :func:`check_launch` raises
an :class:`~mpisync.InvalidParamError` that names the launcher and the fix;
``MPISYNC_ALLOW_SINGLETON=1`` allows it on purpose.

Which variable says what (the innermost launcher decides): an MPI process manager's own count
(``PMI_SIZE``: MPICH's and Intel MPI's mpiexec, ``srun --mpi=pmi2``, Cray PALS, Flux;
``OMPI_COMM_WORLD_SIZE``: Open MPI's mpirun; ``MV2_COMM_WORLD_SIZE``: MVAPICH), a rank above 0
from a launcher that names no size (``PMIX_RANK``, ``PALS_RANKID``), then ``WORLD_SIZE``
(torchrun), ``HOROVOD_SIZE`` (horovodrun with Gloo), the task count of a Slurm step
(``SLURM_STEP_NUM_TASKS``, else ``SLURM_NTASKS``/``SLURM_NPROCS``, only inside a step:
``SLURM_STEP_ID`` set; a batch script itself is a step of one), ``FLUX_JOB_SIZE`` and LSF's
``JSM_NAMESPACE_SIZE``. When an MPI process manager's count is there, it alone decides:
``mpiexec -n 1`` inside a Slurm step of several tasks is one process on purpose.
"""

from __future__ import annotations

import os as _os
from collections.abc import Mapping

from mpi4py import MPI

from .. import config as _config
from ..errors import InvalidParamError
from . import failfast as _failfast

__all__ = ["check_launch", "launch_problem", "launch_status", "started_by"]

_ALLOW = "MPISYNC_ALLOW_SINGLETON"
_MPI_FIX = (
    "Launch with the mpiexec of the MPI library mpi4py loaded (`mpisync info` names it), "
    "or build mpi4py against the launcher's MPI"
)
_SLURM_FIX = (
    "Launch with `srun --mpi=pmi2 ...` (or MpiDefault=pmi2 in slurm.conf, or "
    "SLURM_MPI_TYPE=pmi2; `--mpi=pmix` for an MPI built with PMIx), or with `mpiexec -n {n}` "
    "inside the allocation"
)
_MPIEXEC_FIX = "launch with `mpiexec -n {n} python ...` (or `srun --mpi=pmi2` under Slurm)"
# (variable, launcher, fix) for the MPI process managers: present, they decide alone
_MPI_SIZES = (
    ("PMI_SIZE", "an MPI launcher speaking PMI (mpiexec, srun --mpi=pmi2, ...)", _MPI_FIX),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun", _MPI_FIX),
    ("MV2_COMM_WORLD_SIZE", "MVAPICH's launcher", _MPI_FIX),
)
# launchers that set a rank and no size: a rank above 0 is enough to know there are more
_MPI_RANKS = (
    ("PMIX_RANK", "a PMIx launcher (prterun, srun --mpi=pmix, ...)", _MPI_FIX),
    ("PALS_RANKID", "HPE Cray PALS", _MPI_FIX),
)
_OTHER_SIZES = (
    (
        "WORLD_SIZE",
        "torchrun",
        "mpisync takes rank and size from MPI, not from torch's rendezvous: " + _MPIEXEC_FIX,
    ),
    (
        "HOROVOD_SIZE",
        "horovodrun with Gloo",
        "mpisync needs MPI: launch a Horovod script with `mpiexec -n {n} python -m "
        "mpisync.horovod train.py` (or `srun --mpi=pmi2` under Slurm), or `horovodrun --mpi`",
    ),
    ("SLURM_STEP_NUM_TASKS", "srun without an MPI plugin", _SLURM_FIX),
    ("SLURM_NTASKS", "srun without an MPI plugin", _SLURM_FIX),
    ("SLURM_NPROCS", "srun without an MPI plugin", _SLURM_FIX),
    ("FLUX_JOB_SIZE", "flux run", "Launch with `flux run -o pmi=simple`, or " + _MPIEXEC_FIX),
    ("JSM_NAMESPACE_SIZE", "LSF's jsrun", _MPI_FIX),
)


def _number(raw: str | None) -> int | None:
    try:
        return int(raw.strip()) if raw is not None else None
    except ValueError:
        return None


def started_by(environ: Mapping[str, str] | None = None) -> tuple[str, str, int, str] | None:
    """``(variable, launcher, processes, fix)`` when the launcher's environment says it started
    more than one process (a rank above 0 counts as "more": ``rank + 1``), else ``None``."""
    env = _os.environ if environ is None else environ
    found = [(v, who, _number(env.get(v)), fix) for v, who, fix in _MPI_SIZES if v in env]
    if found:  # the innermost process manager's own count
        variable, launcher, count, fix = found[0]
        return (variable, launcher, count, fix) if count is not None and count > 1 else None
    for variable, launcher, fix in _MPI_RANKS:
        rank = _number(env.get(variable))
        if rank is not None and rank > 0:
            return variable, launcher, rank + 1, fix
    in_step = "SLURM_STEP_ID" in env
    for variable, launcher, fix in _OTHER_SIZES:
        if variable.startswith("SLURM_") and not in_step:
            continue
        count = _number(env.get(variable))
        if count is not None and count > 1:
            if variable == "WORLD_SIZE" and "TORCHELASTIC_RUN_ID" not in env:
                launcher = "a torch launcher (WORLD_SIZE set)"
            return variable, launcher, count, fix
        if count is not None:  # this launcher says one process: it decides
            return None
    return None


def launch_problem(world_size: int, environ: Mapping[str, str] | None = None) -> str:
    """What is wrong with a world of ``world_size`` processes in this environment, or ``""``."""
    if world_size != 1:
        return ""
    found = started_by(environ)
    if found is None:
        return ""
    variable, launcher, count, fix = found
    env = _os.environ if environ is None else environ
    said = f"{variable}={env.get(variable, '').strip()}"
    more = (
        f"one of {count} processes"
        if not variable.endswith(("RANK", "RANKID"))
        else (f"rank {count - 1} of at least {count}")
    )
    return (
        f"mpisync: this process is alone in its MPI world (MPI.COMM_WORLD has 1 process), but "
        f"{launcher} started it as {more} ({said}): every process would sync with itself only "
        f"and train its own model. {fix.format(n=count)}. To run single processes on "
        f"purpose, set {_ALLOW}=1."
    )


def launch_status(world_size: int, environ: Mapping[str, str] | None = None) -> str:
    """One line for ``mpisync info``: how this process was launched, and whether syncs accept
    it."""
    problem = launch_problem(world_size, environ)
    if problem and _config.switch(_ALLOW):
        return f"allowed by {_ALLOW}=1: {problem.removeprefix('mpisync: ')}"
    if problem:
        return f"MISMATCH, every sync raises: {problem.removeprefix('mpisync: ')}"
    if world_size > 1:
        return f"ok: one MPI world of {world_size} processes"
    return "ok: one process, no launcher that started more"


def check_launch(comm=None) -> None:
    """Raise :class:`~mpisync.InvalidParamError` when ``comm`` (default ``MPI.COMM_WORLD``) has
    one process, ``MPI.COMM_WORLD`` too, and the launcher's environment says it started more;
    unless ``MPISYNC_ALLOW_SINGLETON=1``. Cheap wherever ``comm`` has several processes: one
    size query. For the first sync of every entry point and the torch backend's group
    creation, before anything collective: there, on a communicator of the whole world, it also
    lets mpisync's own duplication of ``MPI.COMM_WORLD`` complete first
    (:func:`mpisync._runtime.failfast.settle`)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if comm.Get_size() != 1:
        _failfast.settle(comm)
        return
    problem = launch_problem(MPI.COMM_WORLD.Get_size())
    if problem and not _config.switch(_ALLOW):
        raise InvalidParamError(problem)
