"""The broadcast plan: which bytes travel in which collective.

Every rank derives the same plan from the agreed manifest, so the collectives
match one to one. Tensors smaller than ``fusion_bytes`` are packed into shared
buckets of at most ``fusion_bytes``; larger ones travel straight from their
own memory, split into chunks of at most ``chunk_bytes`` so no count exceeds
what a C ``int`` holds. A run of parameters that sit end to end in memory
(see :mod:`mpisync.params.layout`) is one unit: it travels like one large tensor.

:func:`bulk_plan` is the host plan of every parameter set: it cuts a set's
:class:`~mpisync.params.columns.HostColumns` sizes (a span's bytes at its lowest index). The
per-piece :func:`build_plan` gives the same sequence; the device steps and the all-reduce's
general plan use its pieces.
"""

from __future__ import annotations

import dataclasses as _dc

import numpy as _np

__all__ = ["Transfer", "build_plan", "bulk_plan", "fused_count", "DEFAULT_CHUNK_BYTES"]

#: Largest single collective: 1 GiB keeps every MPI count far below 2**31.
DEFAULT_CHUNK_BYTES = 1 << 30


@_dc.dataclass(frozen=True)
class Transfer:
    """One collective. ``pieces`` are ``(param index, param offset, buffer offset, nbytes)``.

    A direct transfer has one piece and no buffer (``fused`` is False): the
    bytes travel from and to the parameter's own memory. ``completes`` lists
    the parameters whose last bytes arrive with this transfer.
    """

    fused: bool
    nbytes: int
    pieces: tuple
    completes: tuple
    # a span transfer: the run's parameters in address order; pieces[0][0] is run[0]
    run: tuple = ()


def build_plan(
    sizes: list, fusion_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, runs: tuple = ()
) -> list:
    """Transfers for parameters of ``sizes`` bytes, in parameter order.

    ``runs`` are tuples of parameter indices adjacent in memory (address
    order); a run of at least ``fusion_bytes`` travels as spans from its
    first member's address, ordered by its smallest index. Zero-size
    parameters need no transfer; they are completed by the next one (or by
    none, when nothing follows: callers fan out every parameter at the end).
    """
    plan: list = []
    bucket: list = []
    bucket_bytes = 0
    waiting: list = []  # zero-size params to complete with the next transfer
    run_at: dict = {}  # smallest index -> run
    in_runs: set = set()
    for run in runs:
        if sum(sizes[i] for i in run) >= fusion_bytes:
            run_at[min(run)] = run
            in_runs.update(run)

    def flush_bucket():
        nonlocal bucket, bucket_bytes, waiting
        if bucket:
            done = tuple(waiting) + tuple(p[0] for p in bucket)
            plan.append(Transfer(True, bucket_bytes, tuple(bucket), done))
            bucket, bucket_bytes, waiting = [], 0, []

    def direct(index, nbytes, members):
        nonlocal waiting
        flush_bucket()
        for start in range(0, nbytes, chunk_bytes):
            n = min(chunk_bytes, nbytes - start)
            last = start + n == nbytes
            done = (tuple(waiting) + members) if last else ()
            plan.append(
                Transfer(
                    False, n, ((index, start, 0, n),), done, members if len(members) > 1 else ()
                )
            )
            if last:
                waiting = []

    for index, nbytes in enumerate(sizes):
        if index in in_runs:
            run = run_at.get(index)
            if run is not None:
                direct(run[0], sum(sizes[i] for i in run), run)
        elif nbytes == 0:
            waiting.append(index)
        elif nbytes < fusion_bytes:
            if bucket_bytes + nbytes > fusion_bytes:
                flush_bucket()
            bucket.append((index, 0, bucket_bytes, nbytes))
            bucket_bytes += nbytes
        else:
            direct(index, nbytes, (index,))
    flush_bucket()
    return plan


def bulk_plan(sizes: _np.ndarray, fusion_bytes: int, chunk_bytes: int) -> list:
    """``(fused, first, last, nbytes)`` per collective, the sequence
    :func:`mpisync.plan.transfers.build_plan`
    gives for ``sizes`` without runs: a fused bucket holds parameters ``first:last`` (empty ones
    included: they add no bytes); a direct transfer is bytes ``last:last + nbytes`` of parameter
    ``first``. Buckets are cut greedily, each next tensor joining while the bucket stays within
    ``fusion_bytes``, as there."""
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
