"""Registration of the ``"mpisync"`` backend with torch.distributed, and ``init_process_group``."""

from __future__ import annotations

import datetime as _datetime

import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.constants import default_pg_timeout as _default_pg_timeout

from ..errors import InvalidParamError
from .process_group import ProcessGroupMPISync

__all__ = ["BACKEND_NAME", "init_process_group"]

BACKEND_NAME = "mpisync"

# The communicator the next default group is made over (init_process_group sets it; torch's own
# rendezvous leaves it None: MPI.COMM_WORLD), and the timeout init_process_group was given
# (seconds).
_base_comm = None
_timeout_override = None


def _seconds(timeout) -> float | None:
    if timeout is None:
        return None
    return timeout.total_seconds() if isinstance(timeout, _datetime.timedelta) else float(timeout)


def _group_timeout(options) -> float | None:
    """The group's timeout: ``init_process_group``'s, else torch's ``timeout`` unless it is torch's
    default (then ``MPISYNC_TIMEOUT``, else mpisync's default applies)."""
    if _timeout_override is not None:
        return _timeout_override
    given = getattr(options, "timeout", None)
    if given is None or given == _default_pg_timeout:
        return None
    return _seconds(given)


def _create(options, _backend_options) -> ProcessGroupMPISync:
    """torch's creator (extended API): the group over the base communicator, or the members'
    sub-communicator for ``new_group``, checked against the rank and size torch expects; its
    timeout is the one given to ``init_process_group`` or ``new_group``."""
    base = _base_comm if _base_comm is not None else MPI.COMM_WORLD
    members = list(options.global_ranks_in_group or [])
    comm = base
    if members and members != list(range(base.size)):
        comm = base.Create_group(base.group.Incl(members))
    if (comm.rank, comm.size) != (options.group_rank, options.group_size):
        raise InvalidParamError(
            f"mpisync backend: torch expects rank {options.group_rank} of {options.group_size}, "
            "but this process "
            f"is rank {comm.rank} of {comm.size} in MPI; launch with mpiexec/srun and let "
            "mpisync.torch."
            "init_process_group() take rank and size from MPI"
        )
    return ProcessGroupMPISync(comm, timeout=_group_timeout(options))


def _register() -> None:
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(
            BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"]
        )


def init_process_group(comm=None, **kwargs) -> None:
    """Initialise torch's default process group on the ``"mpisync"`` backend over ``comm``
    (default ``MPI.COMM_WORLD``): rank and size come from MPI, the store is an in-process one
    (nothing else rendezvouses). Other keyword arguments pass to
    ``torch.distributed.init_process_group``; ``timeout`` (a timedelta or seconds) also bounds
    every mpisync operation (default ``MPISYNC_TIMEOUT``, else 300 s)."""
    global _base_comm, _timeout_override
    comm = MPI.COMM_WORLD if comm is None else comm
    kwargs.pop("backend", None)
    if "rank" in kwargs or "world_size" in kwargs:
        raise InvalidParamError(
            "mpisync.torch.init_process_group takes rank and size from MPI; "
            "pass neither rank nor world_size"
        )
    if "store" not in kwargs and "init_method" not in kwargs:
        kwargs["store"] = dist.HashStore()
    _base_comm, _timeout_override = comm, _seconds(kwargs.get("timeout"))
    if _timeout_override is not None:  # torch takes a timedelta only; seconds are accepted here
        kwargs["timeout"] = _datetime.timedelta(seconds=_timeout_override)
    try:
        dist.init_process_group(BACKEND_NAME, rank=comm.rank, world_size=comm.size, **kwargs)
    finally:
        _timeout_override = None


_register()
