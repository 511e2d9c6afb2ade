"""The all-reduce plan: which bytes every rank reduces in which collective, and the copies around
it.

Every rank compiles the same steps from the agreed manifest, so the
collectives match one to one. Parameters are grouped by the dtype MPI reduces
in (a fused bucket holds one dtype); within a group, tensors smaller than
``fusion_bytes`` are packed into buckets of at most ``fusion_bytes`` (the
broadcast plan's :func:`~mpisync.plan.transfers.build_plan`), larger ones are reduced
in place in their own memory. Half-precision values travel as ``float32``
(see :mod:`mpisync.allreduce.ops`).
"""

from __future__ import annotations

import typing as _typing

import numpy as _np

from ..plan.arena import Arena, copy_list
from ..plan.transfers import build_plan
from . import ops as _ops

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
    "plan_steps",
]

# : Bytes every fused bucket starts on (a multiple of every itemsize): buckets of one dtype lie end
# to end.
BUCKET_ALIGN = 64
#: The largest in-place all-reduce (a multiple of every itemsize: chunks never split a value).
CHUNK_BYTES = 1 << 30


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of :data:`BUCKET_ALIGN`."""
    return -(-nbytes // BUCKET_ALIGN) * BUCKET_ALIGN


def fused_arena(nbytes: int, arena_for=None) -> tuple:
    """``(arena, base)`` for ``nbytes`` of fused buckets: what ``arena_for(nbytes)`` returns, unless
    it is None (or there are no fused bytes), then a private arena from byte 0."""
    placed = arena_for(nbytes) if arena_for is not None and nbytes else None
    return placed if placed is not None else (Arena(nbytes, vectored=False), 0)


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


def _divider(op: str, size: int, params: list, pieces: tuple, buffer, itemsize: int):
    """``divide()`` for ``avg``: the sum over ``size`` ranks of each piece's replicas, divided by
    their count."""
    if op != "avg":
        return None
    counts = {size * len(params[i].replicas) for i, _, _, _ in pieces}
    if len(counts) == 1:
        count = counts.pop()
        return lambda: _ops.divide(buffer, count)
    parts = [
        (buffer[b // itemsize : (b + n) // itemsize], size * len(params[i].replicas))
        for i, _, b, n in pieces
    ]

    def divide_parts() -> None:
        for part, count in parts:
            _ops.divide(part, count)

    return divide_parts


def _then(first, second):
    if first is None:
        return second
    if second is None:
        return first
    return lambda: (first(), second())


def _fused_step(params, dtype, op, pieces, buffer, arena, offset, divide, label) -> ReduceStep:
    if not _ops.is_staged(dtype, op):
        copies = copy_list(offset, [params[i].master.data for i, _, _, _ in pieces])
        return ReduceStep(
            buffer,
            label,
            lambda: arena.gather(copies),
            _then(divide, lambda: arena.scatter(copies)),
            True,
        )
    size = buffer.itemsize
    slots = [
        ([r.data for r in params[i].replicas], buffer[b // size : (b + n) // size])
        for i, _, b, n in pieces
    ]

    def load():
        for sources, part in slots:
            _combine_into(part, sources, dtype, op)

    def store():
        for sources, part in slots:
            _ops.narrow_into(sources[0], part, dtype)

    return ReduceStep(buffer, label, load, _then(divide, store), True)


def _direct_step(params, dtype, op, piece, rdtype, divide_for, label) -> ReduceStep:
    index, offset, _, nbytes = piece
    raw = params[index].master.data
    if not _ops.is_staged(dtype, op):
        buffer = _np.frombuffer(raw, rdtype, nbytes // rdtype.itemsize, offset)
        return ReduceStep(buffer, label, None, divide_for(buffer), False)
    # plan bytes count staged values: the source holds ``ratio`` times fewer bytes
    ratio = rdtype.itemsize // _ops.itemsize(dtype)
    sources = [r.data[offset // ratio : (offset + nbytes) // ratio] for r in params[index].replicas]
    buffer = _np.empty(nbytes // rdtype.itemsize, rdtype)
    return ReduceStep(
        buffer,
        label,
        lambda: _combine_into(buffer, sources, dtype, op),
        _then(divide_for(buffer), lambda: _ops.narrow_into(sources[0], buffer, dtype)),
        False,
    )


class ReducePlan(_typing.NamedTuple):
    """Which bytes every rank reduces in which collective: per transfer, its dtype, the dtype MPI
    reduces in, the parameters' indices it draws from and its fused bucket's offset (-1: reduced
    in place), with ``arena_bytes`` of fused buckets laid end to end. The same on every rank that
    agreed on the manifest."""

    transfers: list  # (dtype, reduce dtype, member indices, Transfer, offset)
    arena_bytes: int


def plan_steps(params: list, op: str, fusion_bytes: int) -> ReducePlan:
    """The plan reducing the masters of ``params`` (in their agreed order) with ``op``: grouped by
    dtype, tensors under ``fusion_bytes`` packed into buckets (:func:`build_plan`)."""
    groups: dict = {}
    for index, p in enumerate(params):
        if p.nbytes:
            groups.setdefault(p.master.dtype, []).append(index)
    transfers = []
    arena_bytes = 0
    for dtype, members in groups.items():
        rdtype = _ops.reduce_dtype(dtype, op)
        scale = rdtype.itemsize / _ops.itemsize(dtype)
        sizes = [int(params[i].nbytes * scale) for i in members]
        for transfer in build_plan(sizes, fusion_bytes, CHUNK_BYTES):
            offset = -1
            if transfer.fused:
                offset, arena_bytes = arena_bytes, arena_bytes + aligned(transfer.nbytes)
            transfers.append((dtype, rdtype, members, transfer, offset))
    return ReducePlan(transfers, arena_bytes)


def build_steps(params: list, op: str, size: int, plan: ReducePlan, arena, base: int) -> list:
    """The steps of ``plan`` over ``size`` ranks, its fused buckets from byte ``base`` of
    ``arena``."""
    steps = []
    for dtype, rdtype, members, transfer, offset in plan.transfers:
        pieces = tuple((members[i], o, b, n) for i, o, b, n in transfer.pieces)
        label = tuple(params[i].name for i, _, _, _ in pieces)
        if transfer.fused:
            buffer = _np.frombuffer(
                arena.view, rdtype, transfer.nbytes // rdtype.itemsize, base + offset
            )
            divide = _divider(op, size, params, pieces, buffer, rdtype.itemsize)
            steps.append(
                _fused_step(params, dtype, op, pieces, buffer, arena, base + offset, divide, label)
            )
        else:
            piece = pieces[0]
            steps.append(
                _direct_step(
                    params,
                    dtype,
                    op,
                    piece,
                    rdtype,
                    lambda buffer, p=piece, r=rdtype: _divider(
                        op, size, params, ((p[0], 0, 0, buffer.nbytes),), buffer, r.itemsize
                    ),
                    label,
                )
            )
    return steps


def compile_steps(params: list, op: str, fusion_bytes: int, size: int, arena_for=None) -> tuple:
    """``(steps, arena)`` reducing the masters of ``params`` (in their agreed order) over ``size``
    ranks.

    The fused buckets lie end to end in a private arena, or from byte ``base`` of the arena that
    ``arena_for(nbytes)`` returns as ``(arena, base)`` (None: a private one)."""
    plan = plan_steps(params, op, fusion_bytes)
    arena, base = fused_arena(plan.arena_bytes, arena_for)
    return build_steps(params, op, size, plan, arena, base), arena


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
