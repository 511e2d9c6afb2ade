"""The cold path of an all-reduce for a dict of arrays of one dtype: the bulk scan and whole-set buckets.

A general manifest (:mod:`mpisync.manifest`) and the per-parameter reduce
plan (:mod:`mpisync.reduceplan`) build several Python objects per tensor,
which on thousands of small gradients costs far more than reducing their
bytes (figures: docs/allreduce.md). A set that :func:`mpisync.bulk.scan` takes
(plain numpy arrays or torch CPU tensors, C-contiguous), whose arrays are all
writable and of one dtype that MPI reduces as it is under ``op``, gets its
manifest from that scan and its buckets as parts of the scan's one
``BufferList``. Anything else (several dtypes, half precision, ``avg`` of
narrow integers, replica lists, devices, a read-only array) takes the general
path, which also words the errors.

Both paths give the same digest and the same collectives, in the same order,
on the same fusion-arena layout: ranks on different paths still agree and
match buffer for buffer, and the node's shared regions line up.
"""

from __future__ import annotations

import numpy as _np

from . import reduceops as _ops
from .arena import Arena
from .arrays import UnsupportedArray, _byte_view, _dtype_name
from .bulk import BulkManifest, bulk_plan, scan
from .reduceplan import BUCKET_ALIGN, CHUNK_BYTES, ReduceStep

__all__ = ["scan_for_reduce", "reduce_dtype_of", "compile_bulk_steps"]


def reduce_dtype_of(manifest: BulkManifest, op: str) -> _np.dtype | None:
    """The one dtype every array of ``manifest`` has, when MPI reduces it as it is under ``op``; else None."""
    try:
        names = {_dtype_name(dtype) for dtype in manifest.dtypes}
    except UnsupportedArray:
        return None
    if len(names) != 1:
        return None
    name = names.pop()
    if _ops.check(name, op) is not None or _ops.is_staged(name, op):
        return None
    return _np.dtype(name)


def scan_for_reduce(params, op: str, *, rank: int, size: int, devices, settings: dict) -> BulkManifest | None:
    """The bulk manifest of ``params`` for an all-reduce with ``op``, or None (the general path applies)."""
    if not isinstance(op, str) or op not in _ops.OPS:
        return None
    manifest = scan(params, rank=rank, size=size, root=0, devices=devices, settings=settings)
    if manifest is None or manifest.held.readonly or reduce_dtype_of(manifest, op) is None:
        return None  # every rank writes every array; a read-only one gets its error from the general path
    return manifest


def _fused(manifest, first: int, last: int, buffer, arena, offset: int, divide) -> ReduceStep:
    copies = ((offset, (), buffer.nbytes, manifest.held.part(first, last)),)

    def store():
        if divide is not None:
            divide()
        arena.scatter(copies)
    return ReduceStep(buffer, tuple(manifest.names[first:last]), lambda: arena.gather(copies), store, True)


def compile_bulk_steps(manifest: BulkManifest, op: str, fusion_bytes: int, size: int, arena_for=None) -> tuple:
    """``(steps, arena)`` as :func:`mpisync.reduceplan.compile_steps` gives them for the same set.

    The plan is :func:`mpisync.bulk.bulk_plan` (the sequence ``build_plan`` gives; empty arrays add
    nothing to a bucket) and the buckets lie end to end from ``BUCKET_ALIGN``-aligned offsets, in a
    private arena or from byte ``base`` of the arena ``arena_for(nbytes)`` returns as ``(arena, base)``."""
    rdtype = reduce_dtype_of(manifest, op)
    plan = bulk_plan(manifest.sizes, fusion_bytes, CHUNK_BYTES)
    offsets, arena_bytes = [], 0
    for fused, _, _, nbytes in plan:
        offsets.append(arena_bytes if fused else -1)
        if fused:
            arena_bytes += -(-nbytes // BUCKET_ALIGN) * BUCKET_ALIGN
    placed = arena_for(arena_bytes) if arena_for is not None and arena_bytes else None
    arena, base = placed if placed is not None else (Arena(arena_bytes, vectored=False), 0)
    count = size if op == "avg" else 1  # one replica of each array on every rank
    steps = []
    for (fused, first, last, nbytes), offset in zip(plan, offsets):
        if fused:
            buffer = _np.frombuffer(arena.view, rdtype, nbytes // rdtype.itemsize, base + offset)
            divide = (lambda b=buffer: _ops.divide(b, count)) if count > 1 else None
            steps.append(_fused(manifest, first, last, buffer, arena, base + offset, divide))
        else:  # bytes last:last + nbytes of array ``first``, reduced in place
            buffer = _np.frombuffer(_byte_view(manifest.values[first]), rdtype, nbytes // rdtype.itemsize, last)
            divide = (lambda b=buffer: _ops.divide(b, count)) if count > 1 else None
            steps.append(ReduceStep(buffer, (manifest.names[first],), None, divide, False))
    return steps, arena
