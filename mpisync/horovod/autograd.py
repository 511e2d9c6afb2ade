"""Horovod's blocking collectives, differentiable as in Horovod: each is a
:class:`torch.autograd.Function` whose backward is Horovod's (allreduce: the same allreduce of
the gradient; allgather: the averaged gradient's own rows; broadcast: the averaged gradient on
the root, zeros elsewhere; alltoall: the gradient sent back along the received splits;
reducescatter: the allgather of the gradient, scaled as the forward was).
"""

from __future__ import annotations

from typing import Any

import torch

from . import ops as _ops
from .compression import Compression
from .context import rank
from .ops import DIFFERENTIABLE
from .process_sets import global_process_set, resolve

__all__ = list(DIFFERENTIABLE)  # torch-free in ops: mpisync.horovod imports this lazily


_set = resolve


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, options: dict, *tensors):
        ctx.options = options
        return tuple(_ops.synchronize(_ops.grouped_allreduce_async(list(tensors), **options)))

    @staticmethod
    def backward(ctx: Any, *grads):
        options = {**ctx.options, "name": None}
        return (None, *grouped_allreduce(list(grads), **options))


def grouped_allreduce(
    tensors, average=None, name=None, compression=Compression.none, op=None, **scales_and_set
):
    """The reduction of each tensor over the set (default: the average), as new tensors
    (``prescale_factor``, ``postscale_factor``, ``process_set`` as in Horovod)."""
    packed = [compression.compress(t) for t in tensors]
    options = {"average": average, "name": name, "op": op, **scales_and_set}
    options["process_set"] = _set(options.get("process_set"))
    reduced = _GroupedAllreduce.apply(options, *[t for t, _ in packed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, packed)]


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, **kwargs):
    """The reduction of ``tensor`` over the set (default: the average), as a new tensor."""
    return grouped_allreduce([tensor], average, name, compression, op, **kwargs)[0]


def grouped_allreduce_(tensors, *args, **kwargs):
    """Reduce every tensor of ``tensors`` in place; return them."""
    return _ops.synchronize(_ops.grouped_allreduce_async_(list(tensors), *args, **kwargs))


def allreduce_(tensor, *args, **kwargs):
    """Reduce ``tensor`` in place; return it."""
    return _ops.synchronize(_ops.allreduce_async_(tensor, *args, **kwargs))


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name, process_set, *tensors):
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        handle = _ops.grouped_allgather_async(list(tensors), name, process_set)
        return tuple(_ops.synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grads):
        reduced = grouped_allreduce(list(grads), average=True, process_set=ctx.process_set)
        counts = grouped_allgather(
            [torch.tensor([n], dtype=torch.int64) for n in ctx.rows], process_set=ctx.process_set
        )
        mine = ctx.process_set.rank()
        offsets = [int(c[:mine].sum()) for c in counts]
        return (
            None,
            None,
            *[g.narrow(0, o, n) for g, o, n in zip(reduced, offsets, ctx.rows)],
        )


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Every rank's tensors concatenated along their first dimension, in rank order."""
    return list(_GroupedAllgather.apply(name, _set(process_set), *tensors))


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (first
    dimensions may differ; the others and the dtype may not)."""
    return grouped_allgather([tensor], name, process_set)[0]


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _ops.synchronize(_ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad):
        reduced = allreduce(grad, average=True, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's ``tensor``, as a new tensor (the input is left as it is)."""
    return _Broadcast.apply(tensor, root_rank, name, _set(process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """Make ``tensor`` root_rank's, in place; return it."""
    return _ops.synchronize(_ops.broadcast_async_(tensor, root_rank, name, _set(process_set)))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor, splits, name, process_set):
        handle = _ops.alltoall_async(tensor, splits, name, process_set)
        output, received = _ops.synchronize(handle)
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, grad, *unused):
        back, _ = alltoall(grad, splits=ctx.received, process_set=ctx.process_set)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send ``splits[i]`` rows of ``tensor`` (default: equal parts) to rank i; the rows
    received in rank order, and with ``splits`` also the counts received from each rank."""
    return _Alltoall.apply(tensor, splits, name, _set(process_set))


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, options: dict, *tensors):
        ctx.options = options
        handle = _ops.grouped_reducescatter_async(list(tensors), **options)
        return tuple(_ops.synchronize(handle))

    @staticmethod
    def backward(ctx: Any, *grads):
        options = ctx.options
        factor = options["prescale_factor"] * options["postscale_factor"]
        if options["op"] == _ops.Sum:
            factor *= options["process_set"].size()
        scaled = [g * factor if factor != 1.0 else g for g in grads]
        return (None, *grouped_allgather(scaled, process_set=options["process_set"]))


def grouped_reducescatter(
    tensors,
    name=None,
    compression=Compression.none,
    op=_ops.Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Reduce each tensor over the set; this rank's block of rows of each (the first
    ``rows % size`` ranks get one row more)."""
    packed = [compression.compress(t) for t in tensors]
    options = dict(
        name=name,
        op=op,
        process_set=_set(process_set),
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )
    reduced = _GroupedReducescatter.apply(options, *[t for t, _ in packed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, packed)]


def reducescatter(tensor, name=None, compression=Compression.none, op=_ops.Average, **kwargs):
    """Reduce ``tensor`` over the set; this rank's block of rows."""
    return grouped_reducescatter([tensor], name, compression, op, **kwargs)[0]
