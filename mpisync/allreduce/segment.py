"""The all-reduce of fused buckets between the ranks of one node, through a file every rank maps.

Each rank packs its small tensors into its own region of a shared segment
(:class:`~mpisync.transports.nodesegment.NodeSegment`, one region per rank, laid out as
the plan's fusion arena). After a barrier, rank ``r`` combines share ``r`` of
every region (the same values of every rank's buckets) and writes the result
into share ``r`` of every region; after a second barrier each rank unpacks
its own region. Between two barriers every byte is written by one rank only,
and after the second a rank reads only its own region, which nobody writes
before the next call's first barrier: two barriers a call, no MPI data
movement, one combine per value over the node. Large tensors stay on MPI,
reduced in place in their own memory. Figures: docs/allreduce.md.

No flag in shared memory orders the ranks' accesses: the two MPI barriers do,
which order memory on any platform (this path needs no atomics of its own).
"""

from __future__ import annotations

import numpy as _np

from ..transports.nodesegment import NodeSegment, setting
from ..transports.sharedreduce import combine_share
from . import ops as _ops
from .plan import aligned

__all__ = ["ReduceSegment"]


class ReduceSegment:
    """One region of ``region_bytes`` per rank in a mapping every rank of ``comm`` shares."""

    def __init__(self, segment: NodeSegment, rank: int, size: int):
        self.segment, self.rank, self.size = segment, rank, size
        self.region_bytes = segment.slot_bytes
        self.arena = segment.arena  # every region; this rank's from byte ``base``
        self.base = rank * self.region_bytes
        self._address = _np.frombuffer(self.arena.view, _np.uint8).ctypes.data

    @classmethod
    def open(cls, comm, nbytes: int, call) -> ReduceSegment | None:
        """A segment of ``comm.size`` regions of ``nbytes`` (rounded up), or None on every rank
        (ranks on several nodes, ``MPISYNC_SHARED_MEMORY=0`` anywhere, no ``/dev/shm``, ...).
        Collective (see :meth:`NodeSegment.open`)."""
        region = aligned(nbytes)
        # Unless switched off; NodeSegment.open also refuses where the platform lacks what it needs.
        segment = NodeSegment.open(
            comm, 0, comm.size, region, call, requested=setting() is not False
        )
        return cls(segment, comm.rank, comm.size) if segment is not None else None

    @property
    def nbytes(self) -> int:
        """Bytes of the mapping (every rank's region and the header)."""
        return self.segment.nbytes

    def spans(self, steps) -> list:
        """``(dtype, start, stop)`` byte ranges of this rank's region covering the fused ``steps``'
        buffers, one per run of buckets of one dtype laid end to end."""
        spans: list = []
        for step in steps:
            if not step.fused:
                continue
            buffer = step.buffer
            start = buffer.ctypes.data - self._address - self.base
            stop = start + buffer.nbytes
            last = spans[-1] if spans else None
            if last is not None and last[0] == buffer.dtype and aligned(last[2]) == start:
                spans[-1] = (last[0], last[1], stop)
            else:
                spans.append((buffer.dtype, start, stop))
        return spans

    def reduce(self, comm, spans: list, op: str, call) -> None:
        """Combine every rank's packed ``spans`` with ``op`` into every region (collective: two
        barriers on ``comm``, waited with ``call``). Every rank has packed its region before."""
        combine = _ops.local_op(op)
        view, size, rank, region = self.arena.view, self.size, self.rank, self.region_bytes
        call(comm.Ibarrier())  # every region holds its rank's values
        # Padding between buckets holds zeros or old values nobody reads: their overflow is not
        # news.
        with _np.errstate(all="ignore"):
            for dtype, start, stop in spans:
                count = (stop - start) // dtype.itemsize
                lo, hi = rank * count // size, (rank + 1) * count // size
                if hi == lo:
                    continue
                offset = start + lo * dtype.itemsize
                parts = [
                    _np.frombuffer(view, dtype, hi - lo, k * region + offset) for k in range(size)
                ]
                combine_share(parts, rank, combine)
        call(comm.Ibarrier())  # every region holds the reduced values
