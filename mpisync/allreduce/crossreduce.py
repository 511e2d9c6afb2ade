"""The all-reduce of large tensors between the ranks of one node by cross-memory reads.

Each rank owns one slice of every large step's buffer (rank ``r`` of ``n``: elements
``[r*c//n, (r+1)*c//n)`` of ``c``). After a barrier, each rank reads its slice of every other
rank's buffer straight from that rank's memory (``process_vm_readv``, a chunk at a time into a
scratch that stays in cache) and combines the ranks' values, in rank order, into a result buffer
of its own. Once every rank says it succeeded, each rank copies its result into its own slice and
reads every other rank's result into the other slices. Every byte crosses between processes once
(MPI's shared-memory path copies it in and out of a shared cell, twice), and the ranks share the
work: each reduces ``1/n`` of the bytes.

Who writes what: in the first phase a rank writes only its result buffer; in the second only its
own buffers, reading the others' result buffers, which nobody writes before the next call's
barrier. A read that fails or falls short on any rank (the two agreements tell every rank) is
redone through MPI: after the first phase every buffer is still as it was loaded (an
``Iallreduce``), after the second every rank's own slice holds the reduced values (an
``Iallgatherv`` in place). The result is the same on every rank, bit for bit: each slice is
combined once, by its owner, and copied.
"""

from __future__ import annotations

import ctypes as _ctypes

import numpy as _np
from mpi4py import MPI

from ..transports import cma as _cma

__all__ = ["CrossReduce", "MIN_BYTES"]

#: The smallest step reduced by cross-memory reads: below, MPI's own path costs less than the
#: three agreements (docs/allreduce.md).
MIN_BYTES = 1 << 20
# Bytes read from a peer per call into the scratch, then combined: the scratch stays in cache.
_CHUNK = 256 << 10
_SCRATCH = _np.empty(2 * _CHUNK, _np.uint8)  # the scratch's shape (never written)


class CrossReduce:
    """Cross-memory reads between every two ranks of ``comm``, checked reachable."""

    def __init__(self, cross: _cma.CrossMemory):
        self.cross = cross
        self.pids = cross.pids

    @classmethod
    def open(cls, comm, call) -> CrossReduce | None:
        """The reads, or None on every rank (ranks on several nodes, ``MPISYNC_CROSS_MEMORY=0``
        anywhere, a pair that cannot reach each other). Collective."""
        cross = _cma.CrossMemory.open(comm, 0, call, None, all_pairs=True)
        return cls(cross) if cross is not None else None

    def bind(self, comm, buffers: list, call) -> CrossProgram:
        """The reads of one set of large step buffers (the same sizes, in the same order, on
        every rank). Collective: one all-gather of addresses."""
        program = self.program(comm.rank, comm.size, buffers)
        call(comm.Iallgather(program.row, program.table))
        program.bind()
        return program

    def program(self, rank: int, size: int, buffers: list, take=None) -> CrossProgram:
        """The reads of ``buffers``, to be bound once every rank's :attr:`CrossProgram.row` is
        gathered into its :attr:`CrossProgram.table` (an all-gather the caller posts); its own
        arrays come from ``take(like)`` where given (reused buffers: see
        :meth:`CrossProgram.arrays`)."""
        return CrossProgram(self.pids, rank, size, buffers, take)


def _slices(count: int, size: int) -> list:
    return [(k * count // size, (k + 1) * count // size) for k in range(size)]


class CrossProgram:
    """One rank's reads and combines for one set of buffers, bound to every rank's addresses."""

    def __init__(self, pids: list, rank: int, size: int, buffers: list, take=None):
        self.pids, self.rank, self.size, self.buffers = pids, rank, size, buffers
        self.slices = [_slices(len(b), size) for b in buffers]
        mine = [b[lo:hi] for b, (lo, hi) in zip(buffers, (s[rank] for s in self.slices))]
        take = take or _np.empty_like
        self.results = [take(part) for part in mine]
        self._mine = mine
        #: this rank's (buffer address, result address) per buffer; :attr:`table`: every rank's
        self.row = _np.array(
            [(b.ctypes.data, r.ctypes.data) for b, r in zip(buffers, self.results)], _np.int64
        ).reshape(len(buffers), 2)
        self.table = _np.empty((size,) + self.row.shape, _np.int64)
        self._scratch = take(_SCRATCH)
        self._second: list = []

    def bind(self) -> None:
        """Compile the second phase's reads from every rank's addresses (:attr:`table`,
        gathered); the first phase's are made as it runs, a chunk at a time."""
        self._second = self._second_phase(self.pids, self.table)

    def _second_phase(self, pids: list, table) -> list:
        """The batches reading every other rank's result into its slice of this rank's
        buffers."""
        read, batches = _cma._CALLS[0], []
        for peer in range(self.size):
            if peer == self.rank:
                continue
            pairs = []
            for index, buffer in enumerate(self.buffers):
                lo, hi = self.slices[index][peer]
                if hi > lo:
                    here = buffer.ctypes.data + lo * buffer.itemsize
                    pairs.append((here, int(table[peer, index, 1]), (hi - lo) * buffer.itemsize))
            batches += _cma._batches(read, pids[peer], pairs)
        return batches

    def combine(self, combine) -> bool:
        """The first phase: this rank's slice of every buffer combined over the ranks with the
        ufunc ``combine``, in rank order, into its result buffers; False when a read failed or
        fell short."""
        with _np.errstate(all="ignore"):
            for index in range(len(self.buffers)):
                if not self._combine_one(index, combine):
                    return False
        return True

    def _combine_one(self, index: int, combine) -> bool:
        read, rank, pids = _cma._CALLS[0], self.rank, self.pids
        # one pair of iovecs, rewritten for every read: the calls take their addresses
        here, there = _cma._Iovec(), _cma._Iovec()
        local, remote = _ctypes.addressof(here), _ctypes.addressof(there)
        halves = (self._scratch[:_CHUNK], self._scratch[_CHUNK:])
        mine, result = self._mine[index], self.results[index]
        itemsize, dtype = mine.itemsize, mine.dtype
        lo = self.slices[index][rank][0] * itemsize
        bases = [int(self.table[peer, index, 0]) + lo for peer in range(self.size)]
        step = max(1, _CHUNK // itemsize)
        for start in range(0, len(result), step):
            stop = min(len(result), start + step)
            nbytes, offset, reads = (stop - start) * itemsize, start * itemsize, 0
            total, out = None, result[start:stop]
            for peer in range(self.size):
                if peer == rank:
                    part = mine[start:stop]
                else:
                    half = halves[reads % 2]
                    reads += 1
                    here.base, here.len = half.ctypes.data, nbytes
                    there.base, there.len = bases[peer] + offset, nbytes
                    if read(pids[peer], local, 1, remote, 1, 0) != nbytes:
                        return False
                    part = half[:nbytes].view(dtype)
                if total is None:
                    total = part
                else:
                    combine(total, part, out=out)
                    total = out
        return True

    def gather(self) -> bool:
        """The second phase: this rank's results into its own slices, every other rank's read
        into theirs; False when a read failed or fell short."""
        for mine, result in zip(self._mine, self.results):
            mine[...] = result
        return _cma.Copies.run_batches(self._second)

    def regather(self, comm) -> list:
        """After a failed second phase: the requests carrying every rank's reduced slice to every
        rank through MPI."""
        requests = []
        for buffer, slices in zip(self.buffers, self.slices):
            counts = [hi - lo for lo, hi in slices]
            displs = [lo for lo, _ in slices]
            requests.append(comm.Iallgatherv(MPI.IN_PLACE, [buffer, (counts, displs)]))
        return requests

    def arrays(self) -> list:
        """This program's own arrays (results and scratch), to hand back for reuse once every
        rank has agreed that the second phase is over."""
        return [*self.results, self._scratch]
