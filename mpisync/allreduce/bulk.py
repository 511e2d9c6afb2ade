"""The cold path of an all-reduce for a dict of bare arrays: the bulk scan and whole-set buckets.

A general manifest (:mod:`mpisync.params.manifest`) and the per-parameter reduce
plan (:mod:`mpisync.allreduce.plan`) build several Python objects per tensor,
which on thousands of small gradients costs far more than reducing their
bytes (figures: docs/allreduce.md). A set that :func:`mpisync.params.bulk.scan` takes
(plain numpy arrays or torch CPU tensors, C-contiguous), whose arrays are all
writable and of dtypes that MPI reduces as they are under ``op``, gets its
manifest from that scan and its buckets as parts of the scan's one
``BufferList`` (or of one ``BufferList`` per dtype, when it holds several).
Anything else (half precision, ``avg`` of narrow integers, replica lists,
devices, a read-only array) takes the general path, which also words the
errors.

Both paths give the same digest and the same collectives, in the same order,
on the same fusion-arena layout: ranks on different paths still agree and
match buffer for buffer, and the node's shared regions line up.
"""

from __future__ import annotations

import numpy as _np

from .._runtime.speedups import loops
from ..params.adapters import UnsupportedArray, _byte_view, _dtype_name
from ..params.bulk import BulkManifest, scan
from ..plan.arena import check_copier, part_copies
from ..plan.transfers import bulk_plan
from . import ops as _ops
from .plan import CHUNK_BYTES, ReducePlan, ReduceStep, aligned, fused_arena

__all__ = [
    "scan_for_reduce",
    "dtype_groups",
    "compile_bulk_steps",
    "plan_bulk_steps",
    "build_bulk_steps",
]


def dtype_groups(manifest: BulkManifest, op: str) -> list | None:
    """``[(dtype, members)]``: the dtypes of ``manifest``'s arrays in the order the general plan
    takes
    them (first appearance among non-empty arrays, in sorted order), each with the indices of its
    non-empty arrays (``None``: every array, the set holding one dtype); None when MPI does not
    reduce one of them as it is under ``op``."""
    try:
        names = {_dtype_name(dtype) for dtype in manifest.dtypes}
    except UnsupportedArray:
        return None
    if any(_ops.check(name, op) is not None or _ops.is_staged(name, op) for name in names):
        return None
    if len(names) == 1:
        return [(_np.dtype(names.pop()), None)]
    groups: dict = {}
    for index, (nbytes, value) in enumerate(zip(manifest.sizes.tolist(), manifest.values)):
        if nbytes:
            groups.setdefault(_dtype_name(value.dtype), []).append(index)
    return [(_np.dtype(name), members) for name, members in groups.items()]


def scan_for_reduce(
    params, op: str, *, rank: int, size: int, devices, settings: dict
) -> BulkManifest | None:
    """The bulk manifest of ``params`` for an all-reduce with ``op``, or None (the general path
    applies)."""
    if not isinstance(op, str) or op not in _ops.OPS:
        return None
    manifest = scan(params, rank=rank, size=size, root=0, devices=devices, settings=settings)
    if manifest is None or manifest.held.readonly or dtype_groups(manifest, op) is None:
        # every rank writes every array; a read-only one gets its error from the general path
        return None
    return manifest


def _fused(held, names, first: int, last: int, buffer, arena, offset: int, divide) -> ReduceStep:
    copies = part_copies(offset, held, first, last)

    def store():
        if divide is not None:
            divide()
        arena.scatter(copies)

    return ReduceStep(buffer, tuple(names[first:last]), lambda: arena.gather(copies), store, True)


def _group_plans(manifest: BulkManifest, op: str, fusion_bytes: int) -> list:
    """``(dtype, buffer list, names, arrays, plan)`` per dtype group, in the general plan's
    order."""
    groups = dtype_groups(manifest, op)
    assert groups is not None, "scan_for_reduce admits only sets whose dtypes MPI reduces"
    out = []
    for dtype, members in groups:
        if members is None:
            held, names, values, sizes = (
                manifest.held,
                manifest.names,
                manifest.values,
                manifest.sizes,
            )
        else:
            values = [manifest.values[i] for i in members]
            names = [manifest.names[i] for i in members]
            held, sizes = loops.array_list(values, _np.ndarray)[0], manifest.sizes[members]
        out.append((dtype, held, names, values, bulk_plan(sizes, fusion_bytes, CHUNK_BYTES)))
    return out


def plan_bulk_steps(manifest: BulkManifest, op: str, fusion_bytes: int) -> ReducePlan:
    """The plan :func:`mpisync.allreduce.plan.plan_steps` gives for the same set: per dtype group,
    :func:`mpisync.plan.transfers.bulk_plan` (the sequence ``build_plan`` gives; empty arrays add
    nothing to a bucket), the buckets end to end from aligned offsets. A transfer is ``(dtype,
    buffer list, names, arrays, (fused, first, last, nbytes), offset)``."""
    transfers, arena_bytes = [], 0
    for dtype, held, names, values, plan in _group_plans(manifest, op, fusion_bytes):
        for transfer in plan:
            offset = -1
            if transfer[0]:
                offset, arena_bytes = arena_bytes, arena_bytes + aligned(transfer[3])
            transfers.append((dtype, held, names, values, transfer, offset))
    return ReducePlan(transfers, arena_bytes)


def build_bulk_steps(
    manifest: BulkManifest, op: str, size: int, plan: ReducePlan, arena, base: int
) -> list:
    """The steps of ``plan`` over ``size`` ranks, its fused buckets from byte ``base`` of
    ``arena``."""
    check_copier(manifest.held, arena, "compile_bulk_steps")
    count = size if op == "avg" else 1  # one replica of each array on every rank
    steps = []
    for dtype, held, names, values, (fused, first, last, nbytes), offset in plan.transfers:
        if fused:
            buffer = _np.frombuffer(arena.view, dtype, nbytes // dtype.itemsize, base + offset)
        else:  # bytes last:last + nbytes of array ``first``, reduced in place
            buffer = _np.frombuffer(
                _byte_view(values[first]), dtype, nbytes // dtype.itemsize, last
            )
        divide = (lambda b=buffer: _ops.divide(b, count)) if count > 1 else None
        if fused:
            steps.append(_fused(held, names, first, last, buffer, arena, base + offset, divide))
        else:
            steps.append(ReduceStep(buffer, (names[first],), None, divide, False))
    return steps


def compile_bulk_steps(
    manifest: BulkManifest, op: str, fusion_bytes: int, size: int, arena_for=None
) -> tuple:
    """``(steps, arena)`` as :func:`mpisync.allreduce.plan.compile_steps` gives them for the same
    set, the buckets placed by :func:`mpisync.allreduce.plan.fused_arena` as there."""
    plan = plan_bulk_steps(manifest, op, fusion_bytes)
    arena, base = fused_arena(plan.arena_bytes, arena_for)
    return build_bulk_steps(manifest, op, size, plan, arena, base), arena
