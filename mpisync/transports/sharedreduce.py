"""All-reduces of mid-size host arrays between the ranks of one node, through a file every rank
maps.

Below :data:`mpisync.transports.policy.CROSS_REDUCE_MIN_BYTES`, pinning a peer's pages on every call
costs more than cross-memory saves, and MPI's all-reduce pays its own hand-offs. Here every rank
has a region of a segment every rank maps (:class:`~mpisync.transports.nodesegment.NodeSegment`,
opened once per communicator), laid out as its array; rank ``r`` owns share ``r`` of the
elements. Each rank copies into its region the shares its peers own (not its own). After the
first collective (which also checks that every rank passed as many bytes), rank ``r`` combines
its own share where it lies in its array, its own values first and then its peers' share ``r``
in rank order, and writes the result over share ``r`` of every peer's region (the values it
just read there); after the second, each rank copies its peers' shares of the result out of its
own region into its array, before the step that ends the operation (no request) is yielded, so
before a later call's copy into the region: the backend's progress engine posts the next
operation's first step only once this one's last is posted. Between two collectives every byte
of the segment is written by one rank at most and read only where nobody writes it. Every rank
ends with the same bytes; with two ranks they are MPI's too (two operands combine alike in
either order).

The result goes over the values the peer wrote and this rank read, not into this rank's own
region for the peers to read: a write to memory whose last use by another core was a read must
first invalidate that core's copy, which can cost many times a write to memory that core last
wrote. Figures: docs/allreduce.md, "Mid-size tensors through the node's segment".

No flag in shared memory orders the ranks' accesses: the MPI collectives between them do (an
``Iallreduce``, then an ``Ibarrier``), which order memory on any platform, so this path needs no
atomics of its own."""

from __future__ import annotations

import typing as _typing

import numpy as _np
from mpi4py import MPI

from .kept import Step, kept_on
from .nodesegment import NodeSegment, setting
from .policy import ALLREDUCE, SHARED, SHARED_REDUCE_MAX_BYTES, choose

__all__ = [
    "SharedReduce",
    "SharedReduceError",
    "combine_share",
    "opened",
    "shared_steps",
]

# The sizes it takes are the policy's (:func:`mpisync.transports.policy.choose`); each rank's
# region holds the largest, :data:`~mpisync.transports.policy.SHARED_REDUCE_MAX_BYTES`.


class SharedReduceError(RuntimeError):
    """Raised on every rank: the ranks' arrays differ in size (nothing written into them)."""


class SharedReduce:
    """One region of :data:`~mpisync.transports.policy.SHARED_REDUCE_MAX_BYTES` per rank in a
    segment every rank of a communicator maps; :meth:`steps` reduces an array, or arrays of one
    dtype laid end to end."""

    def __init__(self, segment: NodeSegment, rank: int, size: int):
        self.segment, self.rank, self.size = segment, rank, size
        self._bytes = _np.frombuffer(segment.arena.view, _np.uint8)
        self._region = segment.slot_bytes

    def steps(
        self, comm, arrays, combine, last: bool = True
    ) -> _typing.Generator[Step, None, None]:
        """The collective steps that reduce ``arrays`` (an array, or a list of them; C-contiguous,
        this rank's, one dtype, at most a region's bytes together, as many bytes on every rank)
        with ``combine`` over ``comm``'s ranks, in place, as if they lay end to end; the closing
        step (no request) is yielded with ``last``. Raises :class:`SharedReduceError` on every
        rank, the arrays untouched, when their sizes differ."""
        flats = [a.reshape(-1) for a in (arrays if isinstance(arrays, list) else [arrays])]
        dtype, rank, size = flats[0].dtype, self.rank, self.size
        nbytes, region = sum(f.nbytes for f in flats), self._region
        regions = [self._bytes[k * region : k * region + nbytes].view(dtype) for k in range(size)]
        count = regions[rank].size
        bounds = [(k * count // size, (k + 1) * count // size) for k in range(size)]
        mine = regions[rank]
        for k, (lo, hi) in enumerate(bounds):
            if k != rank:  # the shares the peers combine
                _copy(flats, lo, hi, mine, into=True)
        # The largest size and the negated smallest: equal sizes everywhere when they agree.
        sizes = _np.array([nbytes, -nbytes], dtype=_np.int64)
        yield [comm.Iallreduce(MPI.IN_PLACE, sizes, MPI.MAX)], False
        if sizes[0] != -sizes[1]:
            raise SharedReduceError(
                f"ranks passed arrays of {-int(sizes[1])} to {int(sizes[0])} bytes to one "
                "all-reduce through the node's segment; nothing was written"
            )
        lo, hi = bounds[rank]
        # This rank's share is combined where it lies when one array holds it, else in the region
        own = _within(flats, lo, hi)
        gathered = own is None
        if gathered:
            own = mine[lo:hi]
            _copy(flats, lo, hi, mine, into=True)
        # the result goes over the peers' values just read: see the module's docstring
        parts = [own if k == rank else regions[k][lo:hi] for k in range(size)]
        with _np.errstate(all="ignore"):  # overflow is the operation's, as MPI's is
            combine_share(parts, rank, combine)
        if gathered:
            _copy(flats, lo, hi, mine, into=False)
        yield [comm.Ibarrier()], False  # every share of the result is in every region
        for k, (lo, hi) in enumerate(bounds):
            if k != rank:
                _copy(flats, lo, hi, mine, into=False)
        # No request: the copies above are done before the step that ends the operation is
        # posted, so before the next operation's copies into the regions (the progress engine
        # starts posting the next one only then).
        yield [], last


def combine_share(parts: list, rank: int, combine) -> None:
    """Combine into ``parts[rank]`` every other part, in rank order, then copy the result into
    every other part: one share of every rank's region, reduced once and written back into each
    region (the caller sets numpy's error state)."""
    share = parts[rank]
    for k, part in enumerate(parts):
        if k != rank:
            combine(share, part, out=share)
    for k, part in enumerate(parts):
        if k != rank:
            part[...] = share


def _pieces(flats: list, lo: int, hi: int):
    """``(view, start)`` pairs: the parts of ``flats`` laid end to end that hold elements ``lo``
    to ``hi``, each with its first element's index in that laying."""
    start = 0
    for flat in flats:
        end = start + flat.size
        if end > lo and start < hi:
            first, stop = max(lo, start), min(hi, end)
            yield flat[first - start : stop - start], first
        start = end


def _copy(flats: list, lo: int, hi: int, region, into: bool) -> None:
    """Copy elements ``lo`` to ``hi`` of ``flats`` laid end to end into the same elements of
    ``region`` (``into``), or back out of it."""
    pieces = [(flats[0][lo:hi], lo)] if len(flats) == 1 else _pieces(flats, lo, hi)
    for view, first in pieces:
        part = region[first : first + view.size]
        if into:
            part[...] = view
        else:
            view[...] = part


def _within(flats: list, lo: int, hi: int):
    """Elements ``lo`` to ``hi`` of ``flats`` laid end to end, as a view of the one array that
    holds them all; None where they span several."""
    if len(flats) == 1:
        return flats[0][lo:hi]
    pieces = list(_pieces(flats, lo, hi))
    return pieces[0][0] if len(pieces) == 1 else None


class _Held:
    """What this module keeps on a communicator: whether the segment was tried, and the path."""

    __slots__ = ("path", "tried")

    def __init__(self):
        self.tried = False
        self.path: SharedReduce | None = None


def _held(comm) -> _Held:
    """This module's state on ``comm``."""
    return kept_on(comm, __name__, _Held)


def opened(comm, nbytes: int) -> _typing.Generator[Step, None, SharedReduce | None]:
    """The path for a reduction of ``nbytes`` on ``comm`` (opening the segment, collectively, on
    the first call that needs it), or None where it does not take them (the same answer on every
    rank). It takes the sizes the policy gives it (:func:`~mpisync.transports.policy.choose`)
    from the first such call on ``comm``, on ranks of one node unless ``MPISYNC_SHARED_MEMORY=0``
    on any rank: a path that changed after some calls would sum in another order, and a call
    repeated on the same inputs must give the same bytes. Every rank calls it for as many bytes in
    the same order, so every rank decides alike."""
    if choose(ALLREDUCE, nbytes, comm.size) != SHARED:
        return None
    held = _held(comm)
    if not held.tried:
        held.tried = True
        requested = setting() is not False
        segment = yield from NodeSegment.open_steps(
            comm, 0, comm.size, SHARED_REDUCE_MAX_BYTES, requested
        )
        held.path = SharedReduce(segment, comm.rank, comm.size) if segment is not None else None
    return held.path


def shared_steps(comm, arrays, combine, last: bool = True) -> _typing.Generator[Step, None, bool]:
    """The steps reducing ``arrays`` (an array, or a list of arrays of one dtype laid end to end)
    over ``comm`` through the node's segment (:meth:`SharedReduce.steps`) where :func:`opened`
    gives the path; returns False, having posted at most the segment's opening, where not."""
    nbytes = sum(a.nbytes for a in arrays) if isinstance(arrays, list) else arrays.nbytes
    path = yield from opened(comm, nbytes)
    if path is None:
        return False
    yield from path.steps(comm, arrays, combine, last)
    return True
