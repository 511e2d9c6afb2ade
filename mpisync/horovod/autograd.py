"""Horovod's blocking collectives, differentiable as in Horovod: each is a
:class:`torch.autograd.Function` whose backward is Horovod's (allreduce: the same allreduce of
the gradient; allgather: the averaged gradient's own rows; broadcast: the averaged gradient on
the root, zeros elsewhere; alltoall: the gradient sent back along the received splits;
reducescatter: the allgather of the gradient, scaled as the forward was).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from . import ops as _ops
from .compression import Compression, Compressor
from .context import rank
from .ops import DIFFERENTIABLE
from .process_sets import ProcessSet, global_process_set, resolve

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
    tensors: Iterable[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,  # None: Average, unless average=False
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> list[torch.Tensor]:
    """Reduce each tensor of ``tensors`` over the ranks of ``process_set`` (default: the
    average), as one operation.

    Blocking: :func:`grouped_allreduce_async` and :func:`synchronize` in one call, and
    differentiable (the gradient is reduced the same way, as in Horovod). Every rank passes
    as many tensors, of the same dtypes and shapes, in the same order. The inputs are not
    modified.

    Args:
        tensors: The tensors to reduce.
        average: Deprecated in Horovod: ``True`` for ``Average``, ``False`` for ``Sum``; use
            ``op``.
        name: The name ranks match the operation by (default: automatic).
        compression: ``Compression.none`` or ``Compression.fp16`` (float tensors travel as
            float16, the results are cast back).
        op: ``Average`` (default), ``Sum``, ``Adasum`` (Horovod's adaptive summation, float
            tensors only), ``Min``, ``Max`` or ``Product``.
        prescale_factor: Applied to each tensor before the reduction.
        postscale_factor: Applied to each result.
        process_set: The ranks to reduce over (default: all; ``None`` too).

    Returns:
        The reduced tensors, new, in the order of ``tensors``.

    Raises:
        ValueError: :func:`init` has not been called, or ``op`` is unknown or given with
            ``average``.
        NotImplementedError: ``op=Adasum`` on a process set other than the global one, or
            on a number of ranks that is not a power of two (as Horovod).
        HorovodInternalError: The ranks' dtypes, shapes, op or factors differ, or they
            called different operations (on every rank).
        HorovodArgumentError: A sparse or meta tensor on some rank (on every rank); a name
            already pending, or a set not usable on this rank (this rank).
        mpisync.SyncTimeoutError: Other ranks did not join the operation in
            ``MPISYNC_TIMEOUT`` (raised with ``MPISYNC_TIMEOUT_ABORT=0``).
    """
    packed = [compression.compress(t) for t in tensors]
    options = {
        "average": average,
        "name": name,
        "op": op,
        "prescale_factor": prescale_factor,
        "postscale_factor": postscale_factor,
        "process_set": _set(process_set),
    }
    reduced = _GroupedAllreduce.apply(options, *[t for t, _ in packed])
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, packed)]


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks of ``process_set``: by default, its average.

    Blocking and differentiable, as Horovod's: the gradient is all-reduced with the same op
    and factors. The dtype and shape must match on every rank for a given name. Data moves
    through a nonblocking MPI all-reduce of a CPU copy; a CUDA tensor's result is on its
    device. The input is not modified.

    Args:
        tensor: The tensor to reduce.
        average: Horovod's older flag (``True``: ``Average``, ``False``: ``Sum``); prefer
            ``op``.
        name: The operation's name, matched across ranks; automatic if ``None``.
        compression: How the tensor travels: ``Compression.none`` or ``Compression.fp16``.
        op: The reduction: ``Average`` (default), ``Sum``, ``Adasum``, ``Min``, ``Max``,
            ``Product``.
        prescale_factor: ``tensor`` is multiplied by it first.
        postscale_factor: The result is multiplied by it.
        process_set: Which ranks take part (default: every rank).

    Returns:
        The reduction over the set, a new tensor of ``tensor``'s shape and dtype.

    Raises:
        ValueError: No :func:`init` yet; ``op`` unknown, or both ``op`` and ``average``.
        NotImplementedError: Asked for ``Adasum`` on a non-global process set or a number of
            ranks that is not a power of two.
        HorovodInternalError: Ranks passed different dtypes, shapes, ops or factors under
            this name, or waited for different operations: raised on every rank.
        HorovodArgumentError: A rank passed a sparse or meta tensor (every rank hears of
            it); the name is pending, or the set is unusable, on this rank.
        mpisync.SyncTimeoutError: The operation did not complete within ``MPISYNC_TIMEOUT``
            (with ``MPISYNC_TIMEOUT_ABORT=0``; the job is aborted by default).
    """
    return grouped_allreduce(
        [tensor],
        average,
        name,
        compression,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )[0]


def grouped_allreduce_(
    tensors: Iterable[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,  # integers scaled in float64, as Horovod
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` in place, as one operation.

    Not differentiable (as Horovod's in-place forms); no ``compression``.

    Args:
        tensors: The tensors to reduce; each is overwritten with its result.
        average: Older form of ``op`` (``True``: Average, ``False``: Sum).
        name: Matched across ranks; automatic when not given.
        op: ``Average`` (default), ``Sum``, ``Adasum`` (Horovod's adaptive summation, float
            tensors only), ``Min``, ``Max`` or ``Product``.
        prescale_factor: Scales each tensor before the reduction.
        postscale_factor: Scales each result.
        process_set: The ranks to reduce over (default: global).

    Returns:
        The list of the input tensors, now holding the results.

    Raises:
        ValueError: :func:`init` is missing, or the ``op``/``average`` pair is invalid.
        NotImplementedError: For ``Adasum`` on a non-global set or a size not a power of two.
        HorovodInternalError: The ranks disagree about the group (on every rank).
        HorovodArgumentError: A rank's tensors cannot travel (every rank); a pending name
            or an unusable set (this rank).
        mpisync.SyncTimeoutError: Not completed within ``MPISYNC_TIMEOUT``.
    """
    handle = _ops.grouped_allreduce_async_(
        list(tensors), average, name, op, prescale_factor, postscale_factor, process_set
    )
    return _ops.synchronize(handle)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,  # None: allreduce.noname.N
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` over the set in place (default: the average).

    Not differentiable, and without ``compression``, as Horovod's ``allreduce_``.

    Args:
        tensor: Reduced, and overwritten with the result.
        average: Horovod's deprecated flag; use ``op``.
        name: The name the ranks match; automatic if ``None``.
        op: Which reduction (default ``Average``).
        prescale_factor: Multiplies ``tensor`` first.
        postscale_factor: Multiplies the result.
        process_set: The ranks that reduce (default: all).

    Returns:
        ``tensor`` itself, holding the result.

    Raises:
        ValueError: Before :func:`init`; an unknown ``op``, or ``op`` with ``average``.
        NotImplementedError: ``op`` is ``Adasum`` and Horovod would refuse it (a non-global
            process set, a number of ranks not a power of two).
        HorovodInternalError: Another rank passed another dtype, shape, op or factor, or
            waits for another operation.
        HorovodArgumentError: Some rank's tensor is sparse or meta, or here: a name already
            pending, a set not usable.
        mpisync.SyncTimeoutError: The ranks did not all take part in time.
    """
    handle = _ops.allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return _ops.synchronize(handle)


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


def grouped_allgather(
    tensors: Iterable[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> list[torch.Tensor]:
    """Gather every rank's tensors: each concatenated along its first dimension, in rank
    order, as one operation.

    Blocking and differentiable: the gradient of each output is averaged over the set and
    each rank takes its own rows of it, as in Horovod. First dimensions may differ between
    ranks; the other dimensions and the dtypes may not.

    Args:
        tensors: This rank's tensors, as many on each rank.
        name: The operation's name; automatic when ``None``.
        process_set: The ranks to gather from (default: every rank).

    Returns:
        One new tensor per input, holding every rank's rows.

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodInternalError: The ranks' dtypes or trailing dimensions differ, or the ranks
            called different operations.
        HorovodArgumentError: A sparse or meta tensor on a rank; on this rank, a name in
            flight or a set it cannot use.
        mpisync.SyncTimeoutError: A rank did not take part within ``MPISYNC_TIMEOUT``.
    """
    return list(_GroupedAllgather.apply(name, _set(process_set), *tensors))


def allgather(
    tensor: torch.Tensor,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order.

    First dimensions may differ between ranks; the others and the dtype may not (a 0-d
    tensor counts as one row). Blocking and differentiable, as Horovod's. The input is not
    modified.

    Args:
        tensor: This rank's rows.
        name: The name ranks match (default: automatic).
        process_set: Whose rows are gathered (default: all ranks).

    Returns:
        A new tensor holding the rows of rank 0, then rank 1, and so on.

    Raises:
        ValueError: Called before :func:`init`.
        HorovodInternalError: Ranks passed other dtypes or trailing shapes, or waited for
            other operations (every rank gets it).
        HorovodArgumentError: Some rank's tensor cannot travel (sparse, meta); or, on this
            rank only, the name is pending or the set unusable.
        mpisync.SyncTimeoutError: The gather did not complete within ``MPISYNC_TIMEOUT``.
    """
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


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> torch.Tensor:
    """Give every rank of the set ``root_rank``'s ``tensor``, as a new tensor.

    Blocking and differentiable, as Horovod's: the root gets the average of the gradients,
    the other ranks zeros. The input is not modified.

    Args:
        tensor: The data on the root; elsewhere a tensor of the same dtype and shape.
        root_rank: The sender: a rank of :func:`init`'s communicator in the set.
        name: The operation's name (automatic when ``None``).
        process_set: The ranks that receive (default: all).

    Returns:
        A new tensor holding the root's values.

    Raises:
        ValueError: :func:`init` has not run.
        HorovodInternalError: Ranks gave different roots, dtypes or shapes, or called
            different operations; the same error on each rank.
        HorovodArgumentError: The root is not in the set, or a tensor is sparse or meta
            (every rank); the name is pending or the set unusable (this rank).
        mpisync.SyncTimeoutError: A rank did not take part within ``MPISYNC_TIMEOUT``.
    """
    return _Broadcast.apply(tensor, root_rank, name, _set(process_set))


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,  # a rank of init()'s communicator, as for broadcast
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> torch.Tensor:
    """Overwrite ``tensor`` with ``root_rank``'s on every rank of the set.

    In place, not differentiable (as Horovod's ``broadcast_``).

    Args:
        tensor: The root's data; overwritten on the other ranks.
        root_rank: Who sends (a rank of :func:`init`'s communicator).
        name: Matched across ranks; automatic if not given.
        process_set: The ranks concerned (default: global).

    Returns:
        ``tensor``, holding the root's values.

    Raises:
        ValueError: Before :func:`init`.
        HorovodInternalError: The ranks disagree about root, dtype or shape, or wait for
            other operations.
        HorovodArgumentError: A root outside the set or an unsupported tensor on any rank;
            a pending name or unusable set on this one.
        mpisync.SyncTimeoutError: Other ranks did not take part in time.
    """
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


def alltoall(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send ``splits[i]`` rows of ``tensor`` to the set's rank ``i``; receive the rows every
    rank sends this one, in rank order.

    Blocking and differentiable: the gradient goes back along the received splits, as in
    Horovod. The dtype and every dimension but the first must match across ranks.

    Args:
        tensor: The rows to send (at least one dimension).
        splits: Rows per destination rank (a list, or an int32/int64 tensor; counts >= 0
            summing to at most the first dimension). Default: equal parts, which need the
            first dimension to divide by the set's size.
        name: The operation's name, matched across ranks.
        process_set: The ranks that exchange (default: all).

    Returns:
        The received rows, without ``splits``; with ``splits``, the pair
        ``(rows, received_splits)``, the second an int32 tensor of the rows received from
        each rank.

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodArgumentError: On every rank, when a rank's splits do not fit, its tensor is
            0-d, sparse or meta; on this rank, a name in flight or an unusable set.
        HorovodInternalError: The ranks' dtypes or trailing dimensions differ, or they wait
            for different operations.
        mpisync.SyncTimeoutError: The exchange did not complete in ``MPISYNC_TIMEOUT``.
    """
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
    tensors: Iterable[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = _ops.Average,
    process_set: ProcessSet | None = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reduce each tensor over the set and keep this rank's block of rows of each.

    The first ``rows % size`` ranks get one row more, as in Horovod. Blocking and
    differentiable: the gradient is the allgather of the outputs' gradients, scaled as the
    forward was.

    Args:
        tensors: Tensors of at least one dimension, alike on every rank.
        name: The name the ranks match (default: automatic).
        compression: ``Compression.none`` or ``Compression.fp16``.
        op: ``Average`` (default) or ``Sum``.
        process_set: The ranks that reduce and share the rows (default: all).
        prescale_factor: Scales each tensor first.
        postscale_factor: Scales each block.

    Returns:
        This rank's block of each reduced tensor, new tensors in input order.

    Raises:
        ValueError: :func:`init` was not called, or ``op`` is unknown.
        HorovodArgumentError: ``Adasum``/``Min``/``Max``/``Product``, or a 0-d, sparse or
            meta tensor on a rank (every rank); a pending name or unusable set (this rank).
        HorovodInternalError: The ranks' dtypes, shapes, op or factors differ, or they wait
            for other operations.
        mpisync.SyncTimeoutError: The reduction did not complete in ``MPISYNC_TIMEOUT``.
    """
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


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = Compression.none,
    op: int = _ops.Average,  # or Sum: Horovod refuses Min, Max, Product here
    process_set: ProcessSet | None = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` over the set; return this rank's block of rows of the result.

    Rows are split in rank order, the first ``rows % size`` ranks getting one more.
    Blocking and differentiable, as Horovod's.

    Args:
        tensor: At least one dimension; the same dtype and shape on every rank.
        name: Matched across ranks; automatic when ``None``.
        compression: How the tensor travels (``Compression.none`` or ``.fp16``).
        op: ``Average`` (default) or ``Sum``.
        process_set: The ranks to reduce over (default: every rank).
        prescale_factor: Multiplies ``tensor`` before the reduction.
        postscale_factor: Multiplies the block.

    Returns:
        This rank's rows of the reduction, a new tensor.

    Raises:
        ValueError: No :func:`init`, or an unknown ``op``.
        HorovodArgumentError: An op other than Average/Sum, a 0-d or unsupported tensor
            (on every rank); this rank's pending name or unusable set.
        HorovodInternalError: Ranks differ in dtype, shape, op or factors, or in the
            operations they wait for.
        mpisync.SyncTimeoutError: Not all ranks took part within ``MPISYNC_TIMEOUT``.
    """
    return grouped_reducescatter(
        [tensor], name, compression, op, process_set, prescale_factor, postscale_factor
    )[0]
