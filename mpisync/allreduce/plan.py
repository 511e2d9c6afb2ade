"""The all-reduce plan: which bytes every rank reduces in which collective, and the copies around
it.

Every rank compiles the same steps from the groups of its agreed manifest
(:mod:`mpisync.allreduce.groups`: one per dtype MPI reduces in, whichever adapter read the set),
so the collectives match one to one. Within a group, tensors smaller than ``fusion_bytes`` are
packed into buckets of at most ``fusion_bytes`` (the broadcast plan's
:func:`~mpisync.plan.transfers.bulk_plan`), larger ones are reduced in place in their own memory.
Half-precision values travel as ``float32`` (see :mod:`mpisync.allreduce.ops`).
"""

from __future__ import annotations

import typing as _typing

import numpy as _np

from ..params.adapters import _byte_view
from ..plan.arena import Arena, check_copier, copy_list, part_copies
from ..plan.transfers import bulk_plan
from . import ops as _ops
from .groups import ReduceGroup

__all__ = [
    "BUCKET_ALIGN",
    "CHUNK_BYTES",
    "ReducePlan",
    "ReduceStep",
    "build_steps",
    "aligned",
    "compile_steps",
    "fused_arena",
    "local_reduce",
    "ordered",
    "plan_groups",
]

# : Bytes every fused bucket starts on (a multiple of every itemsize): buckets of one dtype lie end
# to end.
BUCKET_ALIGN = 64
#: The largest in-place all-reduce (a multiple of every itemsize: chunks never split a value).
CHUNK_BYTES = 1 << 30


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`BUCKET_ALIGN`."""
    return -(-nbytes // BUCKET_ALIGN) * BUCKET_ALIGN


def fused_arena(nbytes: int) -> Arena:
    """A private arena for ``nbytes`` of fused buckets."""
    return Arena(nbytes, vectored=False)


class ReduceStep:
    """One all-reduce: ``buffer`` (typed, reduced in place), ``load()`` before it, ``store()``
    after."""

    __slots__ = ("buffer", "label", "load", "store", "fused")

    def __init__(self, buffer, label: tuple, load, store, fused: bool):
        self.buffer, self.label, self.load, self.store, self.fused = (
            buffer,
            label,
            load,
            store,
            fused,
        )


def local_reduce(params: list, op: str) -> None:
    """Combine every parameter's replicas into its master (the local half of the reduction);
    staged parameters are combined in their staging buffers instead (see :func:`_combine_into`)."""
    combine = _ops.local_op(op)
    for p in params:
        dtype = p.master.dtype
        if len(p.replicas) < 2 or _ops.is_staged(dtype, op):
            continue
        total = _np.frombuffer(p.master.data, dtype)
        for r in p.replicas[1:]:
            combine(total, _np.frombuffer(r.data, dtype), out=total)


def _combine_into(out, sources: list, dtype: str, op: str) -> None:
    """Widen the first of ``sources`` (replicas' bytes) into ``out``, and combine the others
    there."""
    _ops.widen(sources[0], dtype, out=out)
    combine = _ops.local_op(op)
    for raw in sources[1:]:
        combine(out, _ops.widen(raw, dtype), out=out)


def _then(first, second):
    if first is None:
        return second
    if second is None:
        return first
    return lambda: (first(), second())


def _parts(group: ReduceGroup, first: int, last: int, buffer) -> list:
    """``(member, its values in buffer)`` for the non-empty members ``first:last`` of a bucket."""
    parts, start, itemsize = [], 0, buffer.itemsize
    for member, nbytes in zip(range(first, last), group.sizes[first:last].tolist()):
        if nbytes:
            parts.append((member, buffer[start // itemsize : (start + nbytes) // itemsize]))
            start += nbytes
    return parts


def _divider(op: str, size: int, group: ReduceGroup, first: int, last: int, buffer):
    """``divide()`` for ``avg`` of members ``first:last`` reduced in ``buffer``: the sum over
    ``size`` ranks of each name's replicas, divided by their count."""
    if op != "avg":
        return None
    counts = group.counts
    if counts is None or len(set(counts[first:last])) == 1:
        count = size * (1 if counts is None else counts[first])
        return lambda: _ops.divide(buffer, count)
    parts = [(part, size * counts[m]) for m, part in _parts(group, first, last, buffer)]

    def divide_parts() -> None:
        for part, count in parts:
            _ops.divide(part, count)

    return divide_parts


def _fused_step(group: ReduceGroup, op: str, size: int, bucket: tuple, arena, offset: int):
    _, first, last, nbytes = bucket
    rdtype = group.rdtype
    buffer = _np.frombuffer(arena.view, rdtype, nbytes // rdtype.itemsize, offset)
    label = tuple(group.names[first:last])
    divide = _divider(op, size, group, first, last, buffer)
    if not group.staged:
        if group.held is not None:
            copies = part_copies(offset, group.held, first, last)
        else:
            copies = copy_list(offset, group.masters[first:last])
        return ReduceStep(
            buffer,
            label,
            lambda: arena.gather(copies),
            _then(divide, lambda: arena.scatter(copies)),
            True,
        )
    replicas, dtype = group.replicas, group.dtype
    assert replicas is not None
    slots = [(replicas[m], part) for m, part in _parts(group, first, last, buffer)]

    def load():
        for sources, part in slots:
            _combine_into(part, sources, dtype, op)

    def store():
        for sources, part in slots:
            _ops.narrow_into(sources[0], part, dtype)

    return ReduceStep(buffer, label, load, _then(divide, store), True)


def _direct_step(group: ReduceGroup, op: str, size: int, transfer: tuple) -> ReduceStep:
    _, index, offset, nbytes = transfer  # bytes offset:offset + nbytes of member ``index``
    rdtype, label = group.rdtype, (group.names[index],)
    count = size * (1 if group.counts is None else group.counts[index])
    if not group.staged:
        buffer = _np.frombuffer(
            _byte_view(group.masters[index]), rdtype, nbytes // rdtype.itemsize, offset
        )
        divide = (lambda: _ops.divide(buffer, count)) if op == "avg" else None
        return ReduceStep(buffer, label, None, divide, False)
    assert group.replicas is not None
    dtype = group.dtype
    # plan bytes count staged values: the source holds ``ratio`` times fewer bytes
    ratio = rdtype.itemsize // _ops.itemsize(dtype)
    sources = [r[offset // ratio : (offset + nbytes) // ratio] for r in group.replicas[index]]
    staged = _np.empty(nbytes // rdtype.itemsize, rdtype)
    divide = (lambda: _ops.divide(staged, count)) if op == "avg" else None
    return ReduceStep(
        staged,
        label,
        lambda: _combine_into(staged, sources, dtype, op),
        _then(divide, lambda: _ops.narrow_into(sources[0], staged, dtype)),
        False,
    )


class ReducePlan(_typing.NamedTuple):
    """Which bytes every rank reduces in which collective: per transfer, its group's index, the
    transfer as :func:`~mpisync.plan.transfers.bulk_plan` gives it over the group's sizes, and its
    fused bucket's offset (-1: reduced in place), with ``arena_bytes`` of fused buckets laid end
    to end. The same on every rank that agreed on the manifest."""

    transfers: list  # (group index, (fused, first, last, nbytes), offset)
    arena_bytes: int


def plan_groups(groups: list, fusion_bytes: int) -> ReducePlan:
    """The plan reducing ``groups`` (:mod:`mpisync.allreduce.groups`) one after another: per
    group, its tensors under ``fusion_bytes`` packed into buckets (:func:`bulk_plan`), the
    buckets end to end from aligned offsets."""
    transfers = []
    arena_bytes = 0
    for index, group in enumerate(groups):
        for transfer in bulk_plan(group.sizes, fusion_bytes, CHUNK_BYTES):
            offset = -1
            if transfer[0]:
                offset, arena_bytes = arena_bytes, arena_bytes + aligned(transfer[3])
            transfers.append((index, transfer, offset))
    return ReducePlan(transfers, arena_bytes)


def build_steps(groups: list, op: str, size: int, plan: ReducePlan, arena) -> list:
    """The steps of ``plan`` over ``size`` ranks, its fused buckets in ``arena``."""
    for group in groups:
        check_copier(group.held, arena, "build_steps")
    steps = []
    for index, transfer, offset in plan.transfers:
        group = groups[index]
        if transfer[0]:
            steps.append(_fused_step(group, op, size, transfer, arena, offset))
        else:
            steps.append(_direct_step(group, op, size, transfer))
    return steps


def compile_steps(groups: list, op: str, fusion_bytes: int, size: int) -> tuple:
    """``(steps, arena)`` reducing ``groups`` over ``size`` ranks, the fused buckets end to end in
    a private arena."""
    plan = plan_groups(groups, fusion_bytes)
    arena = fused_arena(plan.arena_bytes)
    return build_steps(groups, op, size, plan, arena), arena


def ordered(step: ReduceStep, op: str) -> ReduceStep:
    """``step`` reducing its floats as integers of their total order (``min``/``max``: see
    :func:`mpisync.allreduce.ops.to_ordered`), or ``step`` itself for other ops and dtypes. The
    mapping is applied after the step's load and undone before its store."""
    as_int = _ops.ordered_dtype(step.buffer.dtype, op)
    if as_int is None:
        return step
    values, load = step.buffer, step.load
    bits = values.view(as_int)

    def to_ordered():
        if load is not None:
            load()
        _ops.to_ordered(values, op)

    return ReduceStep(
        bits,
        step.label,
        to_ordered,
        _then(lambda: _ops.from_ordered(bits, op), step.store),
        step.fused,
    )
