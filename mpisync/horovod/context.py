"""``hvd.init()`` and what it sets up: the communicator, ranks and sizes, and the syncers the
operations reuse (one :class:`~mpisync.ParamSync` per root, one :class:`~mpisync.GradSync` per
reduction), closed by ``hvd.shutdown()``."""

from __future__ import annotations

import weakref as _weakref

from mpi4py import MPI

from .._runtime.launch import check_launch
from ..allreduce import GradSync
from ..errors import InvalidParamError
from ..sync import ParamSync

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_threads_supported",
    "require",
    "default_comm",
    "check_process_set",
]


class _Context:
    """What ``init()`` made: the communicator and its layout, and the syncers in use."""

    def __init__(self, comm: MPI.Intracomm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(self.local_rank, self.rank)  # one rank per node, by local rank
        self.cross_rank, self.cross_size = cross.Get_rank(), cross.Get_size()
        local.Free()
        cross.Free()
        self._syncers: dict[int, ParamSync] = {}
        self._reducers: dict[str, GradSync] = {}
        self.optimizers: _weakref.WeakSet = _weakref.WeakSet()  # their reducers close with us

    def syncer(self, root: int) -> ParamSync:
        """The broadcaster from ``root`` (made at first use, reused)."""
        if root not in self._syncers:
            self._syncers[root] = ParamSync(self.comm, root=root)
        return self._syncers[root]

    def reducer(self, op: str) -> GradSync:
        """The all-reduce with ``op`` (made at first use, reused)."""
        if op not in self._reducers:
            self._reducers[op] = GradSync(self.comm, op=op)
        return self._reducers[op]

    def close(self) -> None:
        for syncer in [*self._syncers.values(), *self._reducers.values()]:
            syncer.close()
        for optimizer in list(self.optimizers):
            optimizer._mpisync.close()
        self._syncers.clear()
        self._reducers.clear()


_context: _Context | None = None


def init(comm: MPI.Intracomm | None = None, process_sets=None) -> None:
    """Start: ``comm`` (an mpi4py intracommunicator, default ``MPI.COMM_WORLD``) becomes the
    job's; a second call is a no-op, as in Horovod. A process alone in its MPI world while its
    launcher started more (torchrun, srun without ``--mpi``) is refused here
    (:func:`mpisync._runtime.launch.check_launch`)."""
    global _context
    if process_sets:
        raise NotImplementedError(
            "mpisync.horovod does not provide process sets: run the job's operations on one "
            "communicator (hvd.init(comm) takes any mpi4py intracommunicator)"
        )
    if _context is not None:
        return
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise InvalidParamError(
            f"hvd.init(comm): comm must be an mpi4py intracommunicator, got {comm!r} (a list of "
            "ranks is Horovod's form: make the communicator with MPI.COMM_WORLD.Create_group or "
            "Split)"
        )
    check_launch(comm)
    _context = _Context(comm)


def shutdown() -> None:
    """Close every syncer ``init()`` made; ``init()`` may be called again."""
    global _context
    if _context is not None:
        _context.close()
        _context = None


def is_initialized() -> bool:
    """Whether ``init()`` was called (and ``shutdown()`` not since)."""
    return _context is not None


def require() -> _Context:
    """The context of ``init()``, or the error Horovod gives before it."""
    if _context is None:
        raise ValueError("mpisync.horovod has not been initialized; use hvd.init().")
    return _context


def default_comm() -> MPI.Intracomm:
    """``init()``'s communicator, or ``MPI.COMM_WORLD`` before ``init()``."""
    return MPI.COMM_WORLD if _context is None else _context.comm


def check_process_set(process_set) -> None:
    """Only the global process set (the default) is provided."""
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError(
            "mpisync.horovod does not provide process sets: only the global one (the default)"
        )


class _GlobalProcessSet:
    """Horovod's ``global_process_set``: every rank of ``init()``'s communicator."""

    def __repr__(self) -> str:
        return "global_process_set"


global_process_set = _GlobalProcessSet()


def rank() -> int:
    """This process's rank in ``init()``'s communicator."""
    return require().rank


def size() -> int:
    """The number of processes in ``init()``'s communicator."""
    return require().size


def local_rank() -> int:
    """This process's rank among those on its node."""
    return require().local_rank


def local_size() -> int:
    """The number of processes on this node."""
    return require().local_size


def cross_rank() -> int:
    """This node's index among the nodes (the rank among processes of the same local rank)."""
    return require().cross_rank


def cross_size() -> int:
    """The number of nodes (processes with this local rank)."""
    return require().cross_size


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE``."""
    require()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE
