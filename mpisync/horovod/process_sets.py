"""Horovod's process sets: operations on a subset of the ranks, each set on its own MPI
sub-communicator with its own :class:`~mpisync.horovod.engine.Engine`.

    even = hvd.add_process_set([0, 2])      # every rank calls it, with the same ranks
    hvd.allreduce(t, process_set=even)      # on ranks 0 and 2 only
    hvd.remove_process_set(even)

``hvd.init(process_sets=[hvd.ProcessSet([0, 1]), ...])`` adds them at start.
``global_process_set`` is every rank of ``init()``'s communicator.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpi4py import MPI

from ..params.agreement import allgather_bytes
from .engine import Engine
from .errors import HorovodArgumentError

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]

NOT_INITIALIZED = "mpisync.horovod has not been initialized; use hvd.init()."


class ProcessSet:
    """A set of ranks of :func:`init`'s communicator that run collectives together.

    Made from a list of ranks or from an mpi4py communicator (its ranks, translated to
    ``MPI.COMM_WORLD``); usable once passed to :func:`add_process_set` or to
    ``init(process_sets=...)``. Each set runs on its own MPI sub-communicator with its own
    engine. ``root_rank`` arguments stay ranks of :func:`init`'s communicator, as in Horovod.
    Unlike Horovod, the ranks are checked against the job when the set is added, and a
    communicator given here is not used itself: the set gets its own.

    Args:
        ranks_or_comm: The ranks (sorted here; any order), or an mpi4py communicator whose
            ranks they are. ``None`` is the empty set (the global set's start).

    Attributes:
        ranks: The set's ranks, sorted.
        process_set_id: Its id once added (``0``: the global set), else ``None``.
    """

    def __init__(self, ranks_or_comm: Sequence[int] | MPI.Comm | None = None):
        self.process_set_id: int | None = None
        self.mpi_comm = None
        self.engine: Engine | None = None
        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm = ranks_or_comm
            group, world = ranks_or_comm.Get_group(), MPI.COMM_WORLD.Get_group()
            members = range(group.Get_size())
            self.ranks = sorted(MPI.Group.Translate_ranks(group, list(members), world))
        else:
            self.ranks = sorted(int(r) for r in (ranks_or_comm or []))

    def _invalidate(self) -> None:
        """Close the set's engine and free its communicator (``remove_process_set``)."""
        if self.engine is not None and self.mpi_comm is not None:
            self.engine.close()
            self.mpi_comm.Free()
            self.mpi_comm = None
        self.process_set_id, self.engine = None, None

    def size(self) -> int:
        """The number of ranks in the set.

        Returns:
            ``len(self.ranks)``, whether or not the set was added (Horovod's gives ``None``
            before it is added).

        Raises:
            ValueError: The global set is asked before :func:`init`.
        """
        if self is global_process_set:
            _world_comm()  # before init(): Horovod's error, not a size of 0
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set, e.g. to find its rows in an
        :func:`allgather`'s result.

        Returns:
            The index of :func:`rank` in ``self.ranks``, or ``-1`` when this process is not
            in the set.

        Raises:
            ValueError: :func:`init` has not been called.
        """
        mine = _world_comm().rank
        return self.ranks.index(mine) if mine in self.ranks else -1

    def included(self) -> bool:
        """Whether this process is in the set.

        Returns:
            ``True`` when :func:`rank` is one of ``self.ranks``.

        Raises:
            ValueError: Called before :func:`init`.
        """
        return self.rank() >= 0

    def require_engine(self) -> Engine:
        """The set's engine, which runs its operations (internal: the collectives call it).

        Returns:
            The set's ``Engine`` on this rank.

        Raises:
            ValueError: :func:`init` has not run.
            HorovodArgumentError: The set was not added (or was removed), or this rank is
                not in it.
        """
        _world_comm()
        if self.process_set_id is None:
            raise HorovodArgumentError(
                f"mpisync.horovod: process set {self.ranks} has not been added "
                "(hvd.add_process_set) or was removed"
            )
        if self.engine is None:
            raise HorovodArgumentError(
                f"mpisync.horovod: this rank is not in process set {self.ranks}"
            )
        return self.engine

    def __eq__(self, other) -> bool:
        return isinstance(other, ProcessSet) and (self.process_set_id, self.ranks) == (
            other.process_set_id,
            other.ranks,
        )

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks)))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


#: Every rank of :func:`init`'s communicator: the default ``process_set`` of each operation.
global_process_set = ProcessSet()


def resolve(process_set: ProcessSet | None) -> ProcessSet:
    """``process_set``, or the global set for None (Horovod's default)."""
    return global_process_set if process_set is None else process_set


_registry: dict[int, ProcessSet] = {}  # id -> set, while initialized (0: the global one)


def _world_comm():
    """``init()``'s communicator, or the error Horovod gives before ``init()``."""
    if global_process_set.engine is None:
        raise ValueError(NOT_INITIALIZED)
    return global_process_set.engine.syncer._user_comm


def start(comm) -> Engine:
    """Make ``global_process_set`` every rank of ``comm`` (``init()``); its engine."""
    global_process_set.ranks = list(range(comm.Get_size()))
    global_process_set.process_set_id, global_process_set.engine = 0, Engine(comm)
    _registry[0] = global_process_set
    return global_process_set.engine


def stop() -> None:
    """Close every process set and the global one's engine (``shutdown()``)."""
    for process_set in list(_registry.values()):
        if process_set is not global_process_set:
            process_set._invalidate()
    if global_process_set.engine is not None:
        global_process_set.engine.close()
    global_process_set.process_set_id, global_process_set.engine = None, None
    _registry.clear()


def _register(process_set: ProcessSet) -> ProcessSet:
    """Make ``process_set`` usable: every rank of ``init()``'s communicator calls this with
    the same ranks, in the same order (checked: a difference raises on every rank)."""
    comm = _world_comm()
    ranks = process_set.ranks

    def agree(world, call):
        parts = allgather_bytes(world, ",".join(map(str, ranks)).encode(), call)
        if len(set(parts)) > 1:
            raise HorovodArgumentError(
                "mpisync.horovod: add_process_set: ranks passed differ between ranks: "
                + "; ".join(f"rank {r}: [{p.decode()}]" for r, p in enumerate(parts))
            )

    global_process_set.require_engine().syncer._collective_exchange(
        "process set agreement", [], agree
    )
    bad = [r for r in ranks if not 0 <= r < comm.size]
    if not ranks or bad or len(set(ranks)) != len(ranks):
        raise HorovodArgumentError(
            f"mpisync.horovod: a process set needs distinct ranks in [0, {comm.size}), got {ranks}"
        )
    if any(ps.ranks == ranks for ps in _registry.values()):
        raise HorovodArgumentError(f"mpisync.horovod: a process set with ranks {ranks} exists")
    sub = comm.Split(0 if comm.rank in ranks else MPI.UNDEFINED, key=comm.rank)
    process_set.process_set_id = max(_registry) + 1
    if sub != MPI.COMM_NULL:
        process_set.mpi_comm, process_set.engine = sub, Engine(sub)
    _registry[process_set.process_set_id] = process_set
    return process_set


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Add a process set, so that operations can run on it.

    Every rank of :func:`init`'s communicator calls it, with the same ranks, as in Horovod;
    the ranks are compared first, so a rank that passes others gets the same error as the
    rest instead of a hang. The set's sub-communicator is split from :func:`init`'s.

    Args:
        process_set: A :class:`ProcessSet` not added yet, or a list of ranks.

    Returns:
        The process set, now with its ``process_set_id`` (a new :class:`ProcessSet` when a
        list was given).

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodArgumentError: The set was already added; its ranks are empty, repeated or
            outside ``[0, size())``; a set with these ranks exists; or the ranks passed differ
            between ranks (on every rank, the same message).
        mpisync.SyncTimeoutError: A rank did not call it within ``MPISYNC_TIMEOUT``
            (with ``MPISYNC_TIMEOUT_ABORT=0``; by default the job is aborted).
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise HorovodArgumentError(f"mpisync.horovod: {process_set!r} was already added")
    return _register(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a process set added before: its engine closes and its sub-communicator is freed.

    Every rank calls it, as in Horovod. The set may be added again afterwards.

    Args:
        process_set: A set returned by :func:`add_process_set`.

    Returns:
        ``True`` if it was removed; ``False`` for the global set or a set not added.

    Raises:
        ValueError: :func:`init` has not been called.
    """
    _world_comm()
    if process_set is global_process_set or process_set.process_set_id is None:
        return False
    _registry.pop(process_set.process_set_id, None)
    process_set._invalidate()
    return True
