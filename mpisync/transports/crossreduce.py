"""All-reduces of large host arrays between the ranks of one node, by cross-memory attach.

Rank ``r`` owns share ``r`` of an array (an equal split of its values). Once every rank's input is
in place (the first collective, which also carries the array's address), each rank reads its share
of every peer's array (``process_vm_readv``) a chunk at a time into a buffer that stays in cache,
combines it into its own array, and writes the combined chunk into every peer's array
(``process_vm_writev``) while it is still in cache; the second collective says every rank is done,
so no array is handed back while a peer still reads or writes it. Between the two collectives a
rank touches only its own share of its own array and its share of its peers' arrays: no two ranks
touch the same bytes. No MPI data movement and no temporary buffer as large as the message: each
byte crosses between processes once each way (figures: docs/allreduce.md, "Large tensors by
cross-memory reads"). A reduce to one rank writes the combined chunks into that rank alone, and
gives it the larger share, since it writes nothing to its peers; the other ranks' arrays then
hold the result in their own share only.

A share is combined by one rank, its own values first and then its peers' in rank order, so every
rank ends with the same bytes; with two ranks they are MPI's too (two operands give the same
result in either order).

Reading and writing another process needs care, so: a rank touches a peer only after reading
back, at the address that peer published, the random token it published (a pid from another PID
namespace or node is never touched), and each call's arrays are published anew in its first
collective. A copy that fails or falls short after that (which the probe rules out but the kernel
may still refuse) leaves the arrays half combined: every rank then raises
:class:`CrossReduceError` at the second collective, and the object is off for later calls (MPI
reduces them).
"""

from __future__ import annotations

import ctypes as _ctypes
import os as _os
import secrets as _secrets
import typing as _typing

import numpy as _np
from mpi4py import MPI

from .cma import (
    BATCH,
    Iovec,
    enabled,
    host_word,
    iovecs,
    iovecs_at,
    read_range,
    system_calls,
    transfer,
)
from .kept import Step, kept_on

__all__ = [
    "CrossReduce",
    "CrossReduceError",
    "combine_of",
    "drive",
    "opened",
    "opened_published",
    "published",
    "reduce_steps",
]

# Bytes read from a peer per call before combining them: small enough to stay in cache, large
# enough that the system call's cost vanishes (256 KiB-4 MiB measured; 1 MiB the best).
_CHUNK = 1 << 20

_UFUNCS = (
    (MPI.SUM, _np.add),
    (MPI.PROD, _np.multiply),
    (MPI.MIN, _np.minimum),
    (MPI.MAX, _np.maximum),
    (MPI.BAND, _np.bitwise_and),
    (MPI.BOR, _np.bitwise_or),
    (MPI.BXOR, _np.bitwise_xor),
)


def combine_of(mpi_op) -> _typing.Callable | None:
    """The numpy ufunc that combines two operands as ``mpi_op`` does, or None (an op this path
    does not take)."""
    for op, ufunc in _UFUNCS:
        if op == mpi_op:
            return ufunc
    return None


class CrossReduceError(RuntimeError):
    """Raised on every rank: the ranks' arrays differ in size (nothing copied), or a cross-memory
    copy failed after the probe (the arrays hold partial values)."""


class CrossReduce:
    """Every rank's pid, each checked readable by every other; :meth:`steps` reduces one array."""

    def __init__(self, pids: list, rank: int):
        self.pids, self.rank, self.size = pids, rank, len(pids)
        self.on = True  # off after a failed copy: MPI from then on, the same on every rank
        self._hot = _np.empty(_CHUNK, dtype=_np.uint8)  # one operation's reads at a time

    @staticmethod
    def open_steps(comm, out: list) -> _typing.Generator[Step, None, None]:
        """The collective steps that probe every pair of ``comm``'s ranks; afterwards ``out``
        holds the object, or None on every rank (ranks on several nodes, cross-memory switched off
        anywhere, a peer that cannot be read)."""
        rank, size = comm.rank, comm.size
        mine = enabled()
        token = _np.frombuffer(_secrets.token_bytes(16), dtype=_np.int64).copy()
        row = _np.array(
            [_os.getpid() if mine else 0, token.ctypes.data, token[0], token[1], host_word()],
            dtype=_np.int64,
        )
        table = _np.empty((size, 5), dtype=_np.int64)
        yield [comm.Iallgather(row, table)], False
        ok = bool(table[:, 0].all()) and bool((table[:, 4] == table[0, 4]).all())
        probe = _np.zeros(2, dtype=_np.int64)
        for peer in range(size) if ok else ():
            if peer == rank:
                continue
            try:
                got = read_range(int(table[peer, 0]), probe.ctypes.data, int(table[peer, 1]), 16)
            except Exception:  # noqa: BLE001 - any local failure: every rank learns it below
                got = -1
            if got != 16 or not _np.array_equal(probe, table[peer, 2:4]):
                ok = False
                break
        everyone = _np.zeros(1, dtype=_np.int64)
        # Every rank's token stays alive until here: nobody leaves before every read is done.
        yield [comm.Iallreduce(_np.array([int(ok)], dtype=_np.int64), everyone, MPI.MIN)], False
        out.append(CrossReduce(table[:, 0].tolist(), rank) if everyone[0] else None)

    def steps(
        self, comm, arrays, combine, last: bool = True, out=None, root: int | None = None
    ) -> _typing.Generator[Step, None, None]:
        """The collective steps that reduce ``arrays`` (an array, or a list of them; C-contiguous,
        this rank's, one dtype, the same sizes on every rank) with ``combine`` over ``comm``'s
        ranks, in place, as if they lay end to end; the second step's ``last`` is ``last``. With
        ``out`` (one array only; this rank's share's size and dtype, possibly that share of the
        array): a reduce-scatter, this rank's share of the result written into ``out``, the
        peers' arrays only read. With ``root`` (and no ``out``): a reduce, the result in
        ``root``'s arrays (the others' hold it in their own share only). Raises
        :class:`CrossReduceError` on every rank when the sizes differ (nothing copied) or a copy
        failed anywhere (the object is then off)."""
        flats = [a.reshape(-1) for a in (arrays if isinstance(arrays, list) else [arrays])]
        addresses = yield from published(comm, flats, "arrays", "all-reduce")
        layout = _Layout(flats, addresses, _weights(self.size, root), self.rank)
        target = None if out is None else out.reshape(-1)
        ok = self._reduce_share(layout, combine, target, root)
        yield from self.settled(comm, ok, last, "all-reduce", "the arrays hold partial values")

    def settled(
        self, comm, ok: bool, last: bool, operation: str, left: str
    ) -> _typing.Generator[Step, None, None]:
        """The closing step of an ``operation``: every rank learns whether every copy went
        through (``ok``: this rank's); if one failed anywhere, the object turns off and every
        rank raises :class:`CrossReduceError` saying what was ``left``. Until this step every
        rank's arrays stay untouched by their owner: nobody leaves while a peer still reads or
        writes them."""
        everyone = _np.zeros(1, dtype=_np.int64)
        yield [comm.Iallreduce(_np.array([int(ok)], _np.int64), everyone, MPI.MIN)], last
        if not everyone[0]:
            self.on = False
            raise CrossReduceError(
                f"a cross-memory copy failed on some rank during an {operation}: {left} on "
                "every rank; later calls go through MPI (MPISYNC_CROSS_MEMORY=0 keeps MPI from "
                "the start)"
            )

    def _reduce_share(self, layout: _Layout, combine, out, root: int | None) -> bool:
        """Combine this rank's share of its own arrays and of every peer's into its arrays (or
        ``out``), a chunk at a time; without ``out``, write each combined chunk into every peer's
        arrays while it is in cache. False when a copy failed."""
        rank, itemsize = self.rank, layout.itemsize
        hot = self._hot[: _CHUNK // itemsize * itemsize].view(layout.dtype)
        peers = [k for k in range(self.size) if k != rank]
        if len(layout.flats) == 1 and peers:
            return self._reduce_one(layout, combine, out, hot, peers, _pushed_to(peers, out, root))
        with _np.errstate(all="ignore"):  # overflow is the operation's, as MPI's is
            for start, pieces in layout.chunks(_CHUNK // itemsize):
                n = sum(length for _, _, length in pieces)
                mine = [layout.flats[i][o : o + length] for i, o, length in pieces]
                results = mine if out is None else [out[start : start + n]]
                if not peers:  # one rank: its share is the result
                    if out is not None:
                        results[0][...] = _np.concatenate(mine)
                    continue
                for peer in peers:
                    if (
                        transfer(0, self.pids[peer], iovecs([hot[:n]]), layout.remote(peer, pieces))
                        != n * itemsize
                    ):
                        return False
                    sources = mine if peer == peers[0] else results
                    if len(results) == 1:
                        combine(
                            _np.concatenate(sources) if len(sources) > 1 else sources[0],
                            hot[:n],
                            out=results[0],
                        )
                    else:
                        h = 0
                        for source, result in zip(sources, results):
                            combine(source, hot[h : h + result.size], out=result)
                            h += result.size
                for peer in _pushed_to(peers, out, root):
                    if (
                        transfer(1, self.pids[peer], iovecs(results), layout.remote(peer, pieces))
                        != n * itemsize
                    ):
                        return False
        return True

    def _reduce_one(self, layout: _Layout, combine, out, hot, peers: list, pushed: list) -> bool:
        """:meth:`_reduce_share` of one array: its chunks by arithmetic and one reused iovec on
        each side, without the general loop's per-chunk search and iovec building
        (docs/allreduce.md, "One array, one loop")."""
        flat, itemsize, lo = layout.flats[0], layout.itemsize, layout.lo
        local, remote = Iovec(), Iovec()
        here, there = _ctypes.addressof(local), _ctypes.addressof(remote)
        calls = system_calls()
        assert calls is not None  # enabled() was true on every rank
        read, write = calls
        hot_base = hot.ctypes.data
        bases = [int(layout.addresses[k][0]) for k in range(self.size)]
        with _np.errstate(all="ignore"):  # overflow is the operation's, as MPI's is
            for start in range(lo, layout.hi, hot.size):
                stop = min(layout.hi, start + hot.size)
                nbytes = (stop - start) * itemsize
                source = result = flat[start:stop]
                if out is not None:
                    result = out[start - lo : stop - lo]
                local.base, local.len, remote.len = hot_base, nbytes, nbytes
                for peer in peers:
                    remote.base = bases[peer] + start * itemsize
                    if read(self.pids[peer], here, 1, there, 1, 0) != nbytes:
                        return False
                    combine(source, hot[: stop - start], out=result)
                    source = result
                local.base = result.ctypes.data
                for peer in pushed:
                    remote.base = bases[peer] + start * itemsize
                    if write(self.pids[peer], here, 1, there, 1, 0) != nbytes:
                        return False
        return True


def published(
    comm, flats: list, what: str, operation: str
) -> _typing.Generator[Step, None, _typing.Any]:
    """The opening step of an ``operation``: every rank publishes the address and size of each
    of its ``flats`` (its arrays, once every one is ready to be read); returns every rank's
    addresses (a row per rank). Sizes that differ from this rank's anywhere raise
    :class:`CrossReduceError` on every rank (each holds the same table: true on every rank or on
    none), nothing copied."""
    k = len(flats)
    mine = _np.array([f.ctypes.data for f in flats] + [f.nbytes for f in flats], _np.int64)
    table = _np.empty((comm.size, 2 * k), dtype=_np.int64)
    yield [comm.Iallgather(mine, table)], False
    if not (table[:, k:] == mine[k:]).all():
        raise CrossReduceError(
            f"ranks passed {what} of different sizes to one {operation}; nothing was copied"
        )
    return table[:, :k]


def _weights(size: int, root: int | None) -> list:
    """Each rank's part of the shares: equal for an all-reduce; for a reduce to ``root``, whose
    combined chunks go nowhere, ``2 size - 1`` for ``root`` and ``2 size - 2`` for the others,
    which also write theirs into ``root`` (a value read, combined or written costs alike: every
    rank then moves as many)."""
    if root is None or size == 1:
        return [1] * size
    return [2 * size - 1 if r == root else 2 * size - 2 for r in range(size)]


def _pushed_to(peers: list, out, root: int | None) -> list:
    """The peers a combined chunk is written into: every peer for an all-reduce, ``root`` alone
    for a reduce (none on ``root``), none for a reduce-scatter (``out``)."""
    if out is not None:
        return []
    if root is None:
        return peers
    return [root] if root in peers else []


class _Layout:
    """Arrays of one dtype laid end to end, shared out by rank: where each rank's share lies in
    each rank's arrays."""

    def __init__(self, flats: list, addresses, weights: list, rank: int):
        self.flats, self.addresses = flats, addresses
        self.dtype, self.itemsize = flats[0].dtype, flats[0].itemsize
        counts = _np.array([f.size for f in flats], dtype=_np.int64)
        self.ends = _np.cumsum(counts)
        total, whole = int(self.ends[-1]), sum(weights)
        before = sum(weights[:rank])
        self.lo, self.hi = before * total // whole, (before + weights[rank]) * total // whole

    def chunks(self, step: int):
        """``(start, pieces)`` per chunk of this rank's share: ``start`` counted from the share's
        first value, ``pieces`` ``(array, offset, length)`` (values), at most ``step`` values and
        ``BATCH`` pieces a chunk."""
        ends, position = self.ends, self.lo
        while position < self.hi:
            pieces: list = []
            stop = min(self.hi, position + step)
            while position < stop and len(pieces) < BATCH:
                i = int(_np.searchsorted(ends, position, side="right"))
                first = int(ends[i - 1]) if i else 0
                length = min(stop, int(ends[i])) - position
                pieces.append((i, position - first, length))
                position += length
            yield position - self.lo - sum(length for _, _, length in pieces), pieces

    def remote(self, peer: int, pieces: list):
        """The iovecs of ``pieces`` in ``peer``'s arrays."""
        row, itemsize = self.addresses[peer], self.itemsize
        return iovecs_at(
            [(int(row[i]) + o * itemsize, length * itemsize) for i, o, length in pieces]
        )


def _held(comm) -> list:
    """What this module keeps on ``comm``: empty until the probe ran, then
    ``[CrossReduce or None]``."""
    return kept_on(comm, __name__, list)


def opened(comm) -> _typing.Generator[Step, None, CrossReduce | None]:
    """The steps that probe ``comm``'s pairs on the first call for ``comm``; returns the path
    (:class:`CrossReduce`), or None where it is not open (the same answer on every rank)."""
    held = _held(comm)
    if not held:
        yield from CrossReduce.open_steps(comm, held)
    cross = held[0]
    return cross if cross is not None and cross.on else None


def opened_published(
    comm, flats: list, what: str, operation: str
) -> _typing.Generator[Step, None, tuple | None]:
    """The opening steps of a copy between the ranks' arrays: the probe on ``comm``'s first call
    (:func:`opened`), then the publication of ``flats`` (:func:`published`); returns ``(the path,
    every rank's addresses)``, or None, having posted at most the probe, where the path is not
    open (the same answer on every rank)."""
    cross = yield from opened(comm)
    if cross is None:
        return None
    addresses = yield from published(comm, flats, what, operation)
    return cross, addresses


def reduce_steps(
    comm, arrays, combine, last: bool = True, out=None, root: int | None = None
) -> _typing.Generator[Step, None, bool]:
    """The steps reducing ``arrays`` over ``comm`` by cross-memory (:meth:`CrossReduce.steps`;
    ``out``: a reduce-scatter into it; ``root``: a reduce to that rank), after the probe of
    ``comm``'s pairs on its first call; returns False, having posted at most the probe, where the
    path is not open (the same answer on every rank). Every rank calls it for the same arrays in
    the same order."""
    cross = yield from opened(comm)
    if cross is None:
        return False
    yield from cross.steps(comm, arrays, combine, last, out, root)
    return True


_T = _typing.TypeVar("_T")


def drive(steps: _typing.Generator[Step, None, _T], call) -> tuple[_T, int]:
    """Run ``steps`` to the end, each request waited with ``call``: ``(what it returned, the
    collectives it posted)``."""
    posted = 0
    while True:
        try:
            requests, _ = next(steps)
        except StopIteration as stop:
            return stop.value, posted
        for request in requests:
            posted += 1
            call(request)
