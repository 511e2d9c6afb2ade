"""A broadcast plan bound to one rank's arrays: the exact copies and collectives to run.

Compiling once and keeping the result lets repeated syncs of the same arrays
skip all per-tensor Python work except the copies themselves. Fusion buffers
are slots of one arena: bucket ``j`` uses slot ``j % slots``. That is safe
because the ring retires a collective before the ``capacity``-th one after it
is posted, so a slot's previous bucket is complete (and unpacked) before the
slot is packed again.
"""

from __future__ import annotations

import dataclasses as _dc

import numpy as _np
from mpi4py import MPI

__all__ = ["Step", "compile_program", "arena_slots", "new_arena"]


@_dc.dataclass
class Step:
    """One collective with the copies around it; pairs are ``(destination, source)`` memoryviews."""

    buffer: list  # [memoryview, MPI.BYTE], as Ibcast takes it
    pack: tuple  # root only, before posting
    unpack: tuple  # receivers only, after completion
    fan_out: tuple  # every rank, after completion: master -> other local replicas
    label: tuple  # parameter names, for timeout diagnostics
    fused: bool

    def finish(self, timeline=None) -> None:
        """Run after the collective completed: unpack, then the local fan-out (spans on ``timeline``)."""
        for name, pairs in (("unpack", self.unpack), ("fan-out", self.fan_out)):
            if not pairs:
                continue
            start = timeline.now() if timeline is not None else 0
            for dst, src in pairs:
                dst[:] = src
            if timeline is not None:
                timeline.span(name, start, copies=len(pairs))


def arena_slots(plan: list, capacity: int) -> int:
    """How many fusion buffers ``plan`` needs with ``capacity`` collectives in flight."""
    return min(capacity, sum(1 for t in plan if t.fused))


def compile_program(params: list, plan: list, *, receiving: bool, arena, fusion_bytes: int) -> list:
    """The steps that carry out ``plan`` (made for ``params``, host memory) on this rank's replicas.

    ``arena`` is a byte ``memoryview`` of at least ``slots * fusion_bytes`` bytes.
    """
    slots = len(arena) // fusion_bytes if fusion_bytes else 0
    steps, bucket = [], 0
    for transfer in plan:
        fan_out = tuple((r.data, params[i].master.data) for i in transfer.completes
                        for r in params[i].replicas[1:])
        label = tuple(params[p[0]].name for p in transfer.pieces)
        if transfer.fused:
            base = (bucket % slots) * fusion_bytes
            view = arena[base:base + transfer.nbytes]
            pairs = tuple((view[off:off + n], params[i].master.data) for i, _, off, n in transfer.pieces)
            pack = () if receiving else pairs
            unpack = tuple((src, dst) for dst, src in pairs) if receiving else ()
            bucket += 1
        else:
            index, start, _, n = transfer.pieces[0]
            view, pack, unpack = params[index].master.data[start:start + n], (), ()
        steps.append(Step([view, MPI.BYTE], pack, unpack, fan_out, label, transfer.fused))
    return steps


def new_arena(nbytes: int) -> memoryview:
    """A byte buffer for fusion slots (numpy-allocated: page-aligned when large)."""
    return memoryview(_np.empty(nbytes, dtype=_np.uint8))
