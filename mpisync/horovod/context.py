"""``hvd.init()`` and what it sets up: the communicator, ranks and sizes, the global process
set and its :class:`~mpisync.horovod.engine.Engine`, closed by ``hvd.shutdown()``."""

from __future__ import annotations

import weakref as _weakref
from collections.abc import Callable

from mpi4py import MPI

from .._runtime.launch import check_launch
from ..errors import InvalidParamError
from . import process_sets as _process_sets

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
]


class _Context:
    """What ``init()`` made: the communicator and its layout, the process sets and their
    engines."""

    def __init__(self, comm: MPI.Intracomm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        cross = comm.Split(self.local_rank, self.rank)  # one rank per node, by local rank
        self.cross_rank, self.cross_size = cross.Get_rank(), cross.Get_size()
        local.Free()
        cross.Free()
        self.engine = _process_sets.start(comm)  # the global process set's
        self.optimizers: _weakref.WeakSet = _weakref.WeakSet()  # their reducers close with us

    def close(self) -> None:
        _process_sets.stop()
        for optimizer in list(self.optimizers):
            optimizer._mpisync.close()


_context: _Context | None = None


def init(comm: MPI.Intracomm | None = None, process_sets=None) -> None:
    """Start: ``comm`` (an mpi4py intracommunicator, default ``MPI.COMM_WORLD``) becomes the
    job's; ``process_sets`` (a list of :class:`~mpisync.horovod.ProcessSet`) are added. A
    second call is a no-op, as in Horovod. A process alone in its MPI world while its launcher
    started more (torchrun, srun without ``--mpi``) is refused here
    (:func:`mpisync._runtime.launch.check_launch`)."""
    global _context
    if _context is not None:
        return
    if comm is None:
        comm = MPI.COMM_WORLD
    if isinstance(comm, list):  # Horovod's form: the ranks of COMM_WORLD to run on
        group = MPI.COMM_WORLD.Get_group().Incl(comm)
        comm = MPI.COMM_WORLD.Create_group(group)
        group.Free()
    if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
        raise InvalidParamError(
            f"hvd.init(comm): comm must be an mpi4py intracommunicator, got {comm!r}"
        )
    check_launch(comm)
    _context = _Context(comm)
    if process_sets:
        try:
            for process_set in process_sets:
                _process_sets.add_process_set(process_set)
        except BaseException:
            shutdown()  # a refused set leaves nothing started
            raise


def shutdown() -> None:
    """Close every engine and process set ``init()`` made; ``init()`` may be called again."""
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
        raise ValueError(_process_sets.NOT_INITIALIZED)
    return _context


def default_comm(process_set=None) -> MPI.Intracomm:
    """``process_set``'s communicator; without one, ``init()``'s, or ``MPI.COMM_WORLD`` before
    ``init()``."""
    if process_set is not None and process_set is not _process_sets.global_process_set:
        return process_set.require_engine().syncer._user_comm
    return MPI.COMM_WORLD if _context is None else _context.comm


def _layout(name: str, doc: str) -> Callable[[], int]:
    """Horovod's function ``name()``: the context's attribute of that name (documented by
    ``doc``), or the error Horovod gives before ``init()``."""

    def read() -> int:
        return getattr(require(), name)

    read.__name__ = read.__qualname__ = name
    read.__doc__ = doc
    return read


rank = _layout("rank", "This process's rank in ``init()``'s communicator.")
size = _layout("size", "The number of processes in ``init()``'s communicator.")
local_rank = _layout("local_rank", "This process's rank among those on its node.")
local_size = _layout("local_size", "The number of processes on this node.")
cross_rank = _layout(
    "cross_rank",
    "This node's index among the nodes (the rank among processes of the same local rank).",
)
cross_size = _layout("cross_size", "The number of nodes (processes with this local rank).")


def mpi_threads_supported() -> bool:
    """Whether MPI runs with ``MPI_THREAD_MULTIPLE``."""
    require()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE
