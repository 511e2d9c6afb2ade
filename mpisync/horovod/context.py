"""``hvd.init()`` and what it sets up: the communicator, ranks and sizes, the global process
set and its :class:`~mpisync.horovod.engine.Engine`, closed by ``hvd.shutdown()``."""

from __future__ import annotations

import weakref as _weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mpi4py import MPI

from .._runtime.launch import check_launch
from ..errors import InvalidParamError
from . import process_sets as _process_sets

if TYPE_CHECKING:
    from .process_sets import ProcessSet

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


def init(
    comm: MPI.Intracomm | list[int] | None = None,
    process_sets: Sequence[ProcessSet | Sequence[int]] | None = None,
) -> None:
    """Start mpisync.horovod: make ``comm`` the job's communicator and add ``process_sets``.

    Every rank of ``comm`` calls it. It sets up the ranks and sizes (``rank()``,
    ``local_rank()``, ``cross_rank()``, ...), the global process set and its engine. A second
    call before :func:`shutdown` does nothing, as in Horovod. Unlike Horovod, there is no
    controller to choose (no Gloo, no ``horovodrun``): the communicator is MPI's, and a
    process alone in its MPI world while its launcher started more (torchrun, ``srun``
    without ``--mpi``) is refused here instead of training alone.

    Args:
        comm: An mpi4py intracommunicator (default ``MPI.COMM_WORLD``), or, as in Horovod, a
            list of ranks of ``MPI.COMM_WORLD`` to run on.
        process_sets: Process sets to add at start (each a :class:`ProcessSet` or a list of
            ranks), as by :func:`add_process_set`, in the same order on every rank.

    Raises:
        mpisync.InvalidParamError: ``comm`` is not an intracommunicator, or the process is
            alone in its MPI world while its launcher started several.
        HorovodArgumentError: A process set is refused (ranks out of range or repeated, a
            set with the same ranks exists, or the ranks differ between ranks); nothing stays
            started then.
    """
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
    """Close every engine and process set :func:`init` made; :func:`init` may be called again.

    Every rank calls it, as in Horovod. The ``DistributedOptimizer`` objects made since
    :func:`init` lose their reducers. Nothing happens before :func:`init`; it raises nothing
    of its own.
    """
    global _context
    if _context is not None:
        _context.close()
        _context = None


def is_initialized() -> bool:
    """Whether :func:`init` was called, and :func:`shutdown` not since.

    Returns:
        ``True`` between :func:`init` and :func:`shutdown`, else ``False`` (it never
        raises).
    """
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


def rank() -> int:
    """This process's rank in :func:`init`'s communicator (``MPI.COMM_WORLD`` by default).

    Returns:
        The rank, from 0 to ``size() - 1``; ``root_rank`` arguments are ranks of this kind.

    Raises:
        ValueError: Called before :func:`init` (Horovod's error and message).
    """
    return require().rank


def size() -> int:
    """The number of processes in :func:`init`'s communicator.

    Returns:
        The number of ranks of the job (of the ranks :func:`init` was given).

    Raises:
        ValueError: Asked before :func:`init` (Horovod's error and message).
    """
    return require().size


def local_rank() -> int:
    """This process's rank among the processes on its node: the GPU index to use, as in
    ``torch.cuda.set_device(hvd.local_rank())``.

    The node is MPI's shared-memory domain (``MPI_COMM_TYPE_SHARED``), as Horovod's.

    Returns:
        The local rank, from 0 to ``local_size() - 1``, in the order of :func:`rank`.

    Raises:
        ValueError: :func:`init` has not run yet (Horovod's error and message).
    """
    return require().local_rank


def local_size() -> int:
    """The number of processes of the job on this node.

    Returns:
        How many ranks share this node's memory (MPI's shared-memory domain).

    Raises:
        ValueError: No :func:`init` yet (Horovod's error and message).
    """
    return require().local_size


def cross_rank() -> int:
    """This node's index among the nodes: this process's rank among the processes that have
    its local rank.

    Returns:
        The cross rank, from 0 to ``cross_size() - 1``.

    Raises:
        ValueError: Before :func:`init` (Horovod's error and message).
    """
    return require().cross_rank


def cross_size() -> int:
    """The number of nodes that have a process of this local rank (the number of nodes when
    every node runs as many processes).

    Returns:
        The number of processes whose local rank is this process's.

    Raises:
        ValueError: Used before :func:`init` (Horovod's error and message).
    """
    return require().cross_size


def mpi_threads_supported() -> bool:
    """Whether MPI was initialized with ``MPI_THREAD_MULTIPLE``.

    It says what the process's other threads may do with MPI; the thread level is the one
    mpi4py initialized MPI with.

    Returns:
        ``True`` when ``MPI.Query_thread()`` is ``MPI.THREAD_MULTIPLE``.

    Raises:
        ValueError: Queried before :func:`init` (Horovod's error and message).
    """
    require()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE
