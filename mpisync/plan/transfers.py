"""The broadcast plan: which bytes travel in which collective.

Every rank derives the same plan from the agreed manifest, so the collectives
match one to one. Tensors smaller than ``fusion_bytes`` are packed into shared
buckets of at most ``fusion_bytes``; larger ones travel straight from their
own memory, split into chunks of at most ``chunk_bytes`` so no count exceeds
what a C ``int`` holds. A run of parameters that sit end to end in memory
(see :mod:`mpisync.params.layout`) is one unit: it travels like one large tensor.

:func:`bulk_plan` is the plan of every parameter set: it cuts the sizes of a set's columns
(:class:`~mpisync.params.columns.HostColumns`, a span's bytes at its lowest index;
:class:`~mpisync.params.columns.DeviceColumns`; each dtype group of the all-reduce,
:mod:`mpisync.allreduce.groups`).
"""

from __future__ import annotations

import numpy as _np

__all__ = ["bulk_plan", "fused_count", "DEFAULT_CHUNK_BYTES"]

#: Largest single collective: 1 GiB keeps every MPI count far below 2**31.
DEFAULT_CHUNK_BYTES = 1 << 30


def bulk_plan(sizes: _np.ndarray, fusion_bytes: int, chunk_bytes: int) -> list:
    """``(fused, first, last, nbytes)`` per collective for parameters of ``sizes`` bytes, in
    parameter order: a fused bucket holds parameters ``first:last`` (empty ones included: they add
    no bytes), tensors smaller than ``fusion_bytes`` cut greedily, each next one joining while the
    bucket stays within ``fusion_bytes``; a direct transfer is bytes ``last:last + nbytes`` of
    parameter ``first``, a tensor of at least ``fusion_bytes`` in chunks of at most
    ``chunk_bytes``. Empty parameters outside a bucket need no transfer."""
    plan: list = []
    ends = _np.cumsum(sizes)
    direct = (
        _np.flatnonzero(sizes >= fusion_bytes) if fusion_bytes > 0 else _np.flatnonzero(sizes > 0)
    )
    start = 0
    for stop in direct.tolist() + [len(sizes)]:
        # Parameters start:stop are all smaller than fusion_bytes: pack them.
        base = int(ends[start - 1]) if start else 0
        while start < stop and int(ends[stop - 1]) > base:
            last = min(int(_np.searchsorted(ends, base + fusion_bytes, side="right")), stop)
            plan.append((True, start, last, int(ends[last - 1]) - base))
            start, base = last, int(ends[last - 1])
        if stop < len(sizes):
            nbytes = int(sizes[stop])
            plan.extend(
                (False, stop, offset, min(chunk_bytes, nbytes - offset))
                for offset in range(0, nbytes, chunk_bytes)
            )
        start = stop + 1
    return plan


def fused_count(plan: list) -> int:
    """How many fused buckets a :func:`bulk_plan` holds."""
    return sum(1 for fused, _, _, _ in plan if fused)
