"""Horovod's asynchronous operations: each is submitted to its process set's
:class:`~mpisync.horovod.engine.Engine` and returns a handle; :func:`synchronize` waits for it,
:func:`poll` says whether it is done. The operations match by name across ranks (unnamed ones
by a per-kind count, as Horovod names them); a description of every tensor travels with the
name, so ranks that disagree get the same error.

The differentiable forms (``allreduce``, ``allgather``, ...) are in
:mod:`mpisync.horovod.autograd`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from . import adasum, kernels
from .context import size
from .engine import Engine, Op
from .process_sets import ProcessSet, global_process_set, resolve

if TYPE_CHECKING:
    import torch

__all__ = [
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Handle",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather_async",
    "grouped_allgather_async",
    "broadcast_async",
    "broadcast_async_",
    "alltoall_async",
    "reducescatter_async",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "barrier",
    "join",
    "poll",
    "synchronize",
]

# The blocking, differentiable collectives (mpisync.horovod.autograd, which needs torch)
DIFFERENTIABLE = (
    "allreduce",
    "allreduce_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
)

#: Horovod's reduction ops (``op=``), with Horovod's values: ``Average`` (the default),
#: ``Sum``, ``Adasum`` (all-reduce only: :mod:`mpisync.horovod.adasum`), ``Min``, ``Max``,
#: ``Product``.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OPS = {Sum: "sum", Min: "min", Max: "max", Product: "prod"}


def reduce_op(average=None, op=None) -> int:
    """Horovod's ``op`` from ``op`` and the older ``average=True/False`` (neither: Average)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Sum if average is False else Average
    if op not in (Average, Adasum, *_OPS):
        raise ValueError(
            f"unknown reduction op {op!r}: use hvd.Average, Sum, Adasum, Min, Max or Product"
        )
    return op


def _mpi_op(op: int, postscale: float, process_set) -> tuple[str, float]:
    """mpisync's reduction and the postscale factor: an average is a sum scaled after."""
    if op == Average:
        return "sum", postscale / process_set.size()
    if op == Adasum:
        return "adasum", postscale
    return _OPS[op], postscale


class Handle:
    """What an ``*_async`` operation returns: pass it to :func:`synchronize` for the result,
    or to :func:`poll`.

    Unlike Horovod's handles (integers), it is an object; it is made by the ``*_async``
    functions, not by user code. :func:`synchronize` may be called on it again and gives
    the same result.

    Args:
        engine: The engine of the process set the operation was submitted to.
        op: The submitted operation.
        post: What turns the operation's result into the handle's (e.g. the first tensor of
            a one-tensor group, or a copy into the input).
    """

    def __init__(self, engine: Engine, op: Op, post: Callable[[Any], Any] = lambda result: result):
        self.engine, self.op, self.post = engine, op, post


def poll(handle: Handle) -> bool:
    """Whether the operation of ``handle`` has completed, without waiting.

    Args:
        handle: A handle returned by an ``*_async`` function.

    Returns:
        ``True`` once the operation has its result (or its error); :func:`synchronize` then
        returns (or raises) without waiting for other ranks.

    Raises:
        AttributeError: ``handle`` is not a :class:`Handle` (e.g. the function that
            :func:`sparse_allreduce_async` returns).
    """
    return handle.engine.poll(handle.op)


def synchronize(handle: Handle | Callable[[], Any]) -> Any:
    """Wait for the operation of ``handle`` to complete and give its result.

    The set's ranks negotiate in rounds while any of them has operations pending (in the
    background at ``MPI_THREAD_MULTIPLE``, else while a rank waits): every operation pending
    on all of them runs, in rank 0's order, so operations of other handles may complete too.
    An error of the operation is raised here, on every rank that waits for it.

    Args:
        handle: A :class:`Handle` from an ``*_async`` function, or the function that
            :func:`sparse_allreduce_async` returns (called).

    Returns:
        The operation's result, which is a tensor (allreduce, allgather, broadcast,
        reducescatter), a list of tensors (the grouped forms), ``(output, received_splits)``
        (alltoall), or the input tensor(s) for the in-place forms, filled with the result.

    Raises:
        HorovodInternalError: The ranks described the operation differently (kind, dtype,
            shape, root rank, op, scale factors), or every rank waits for operations that no
            other rank submitted; the same error on every rank, before any data moves.
        HorovodArgumentError: A rank's arguments were refused (a root rank outside the set,
            splits that do not fit, a sparse or meta tensor): every rank gets it, naming the
            rank(s).
        mpisync.SyncTimeoutError: The other ranks did not take part within
            ``MPISYNC_TIMEOUT``; raised with ``MPISYNC_TIMEOUT_ABORT=0``, else the job is
            aborted. :class:`mpisync.PeerExitedError` (a subclass) when one has exited.
        mpisync.SyncError: The set's engine is unusable after such a timeout.
    """
    if callable(handle) and not isinstance(handle, Handle):
        return handle()
    return handle.post(handle.engine.wait(handle.op))


def _desc(kind: str, match: list, shapes: list, extra: Any = None, error: str = "") -> dict:
    return {"k": kind, "m": match, "s": shapes, "x": extra, "e": error}


def _refused(tensors) -> str:
    """Why these tensors cannot travel (a sparse or meta tensor), or "": found before the
    operation is submitted, so that every rank hears of it instead of waiting."""
    for i, t in enumerate(tensors):
        if t.is_sparse or t.device.type == "meta":
            what = "sparse" if t.is_sparse else "meta"
            return f"tensor {i} is a {what} tensor (sparse: use sparse_allreduce_async)"
    return ""


def _dtype(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _submit(process_set, kind: str, name, desc: dict, run) -> tuple:
    process_set = resolve(process_set)
    engine = process_set.require_engine()
    # Horovod's names: one namespace per kind ("allreduce.x" and "allgather.x" may both pend)
    op = Op(f"{kind}.{name}" if name is not None else engine.auto_name(kind), desc, run)
    return engine, engine.submit(op)


def grouped_allreduce_async(
    tensors: Iterable[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start the reduction of each tensor of ``tensors`` over the ranks of ``process_set``.

    The group is one operation under one name: every rank passes as many tensors, with the
    same dtypes and shapes, in the same order. The group is fused, as Horovod fuses tensors:
    the tensors reduced in one dtype are copied end to end into one CPU buffer and reduced by
    one collective (a CUDA tensor comes back on its device); float16 and bfloat16 are reduced
    in float32. The inputs are not modified. ``Adasum`` is Horovod's algorithm
    (:mod:`mpisync.horovod.adasum`): float16 (in its own dtype), float32 and float64 only, on
    the global process set of a power-of-two size, as in Horovod.

    Args:
        tensors: The tensors to reduce (any dtype torch and MPI share, any device).
        average: Horovod's older form of ``op``: ``True`` is ``Average``, ``False`` is
            ``Sum``. Pass ``op`` instead.
        name: The operation's name; ranks match operations by name (default: an automatic
            ``allreduce.noname.N``, counted on each rank).
        op: ``Average`` (the default), ``Sum``, ``Adasum``, ``Min``, ``Max`` or ``Product``.
        prescale_factor: Each tensor is multiplied by it before the reduction (integers in
            float64, then truncated, as Horovod).
        postscale_factor: The result is multiplied by it (an average divides by the set's
            size here too).
        process_set: The ranks to reduce over (default: the global set; ``None`` too).

    Returns:
        A :class:`Handle`; :func:`synchronize` gives the list of reduced tensors (new ones).

    Raises:
        ValueError: :func:`init` has not been called; or ``op`` and ``average`` are both
            given, or ``op`` is not a known reduction; or ``op=Adasum`` with a bfloat16
            tensor (as Horovod).
        NotImplementedError: ``op=Adasum`` on a process set other than the global one, or
            with a number of ranks that is not a power of two (Horovod's messages).
        HorovodArgumentError: ``name`` is already pending on this rank, or ``process_set``
            was not added or does not hold this rank (this rank only). Errors that depend
            on other ranks come from :func:`synchronize`, where ``Adasum`` of a dtype other
            than float16, float32 or float64 raises HorovodInternalError (Horovod's
            "Unsupported data type").
    """
    tensors, process_set = list(tensors), resolve(process_set)
    horovod_op = reduce_op(average, op)
    if horovod_op == Adasum:
        adasum.check(process_set == global_process_set, size(), tensors)
    mpi_op, post = _mpi_op(horovod_op, float(postscale_factor), process_set)
    pre = float(prescale_factor)
    shapes = [list(t.shape) for t in tensors]
    # as Horovod's coordinator: the op and both factors must match too
    desc = _desc(
        "allreduce",
        [horovod_op, pre, float(postscale_factor), [_dtype(t) for t in tensors], shapes],
        shapes,
        [mpi_op, pre, post],
        _refused(tensors),
    )

    def run(comm, call, descs):
        if mpi_op == "adasum":
            return adasum.allreduce(comm, call, tensors, pre, post)
        return kernels.allreduce(comm, call, tensors, mpi_op, pre, post)

    return Handle(*_submit(process_set, "allreduce", name, desc, run))


def _copied_into(targets):
    def post(results):
        for target, result in zip(targets, results):
            target.data.copy_(result)
        return targets

    return post


def grouped_allreduce_async_(tensors: Iterable[torch.Tensor], *args: Any, **kwargs: Any) -> Handle:
    """Start the in-place reduction of each tensor of ``tensors``.

    As :func:`grouped_allreduce_async`, but :func:`synchronize` writes each result into its
    input (``tensor.data``) and returns the inputs.

    Args:
        tensors: The tensors to reduce and overwrite.
        *args: :func:`grouped_allreduce_async`'s ``average``, ``name``, ``op``,
            ``prescale_factor``, ``postscale_factor``, ``process_set``, in its order.
        **kwargs: The same parameters by name.

    Returns:
        A :class:`Handle` whose result is the list ``tensors``, reduced.

    Raises:
        ValueError: Before :func:`init`, or for ``op``/``average`` as in
            :func:`grouped_allreduce_async`.
        NotImplementedError: ``op=Adasum`` on a non-global set or a size not a power of two.
        HorovodArgumentError: The name is pending already, or the set is not usable on this
            rank.
    """
    tensors = list(tensors)
    handle = grouped_allreduce_async(tensors, *args, **kwargs)
    handle.post = _copied_into(tensors)
    return handle


def allreduce_async(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """Start the reduction of ``tensor`` over the set (default: the average).

    A one-tensor :func:`grouped_allreduce_async`; the input is not modified. The tensor's
    dtype and shape must be the same on every rank for a given name.

    Args:
        tensor: The tensor to reduce.
        *args: ``average``, ``name``, ``op``, ``prescale_factor``, ``postscale_factor``,
            ``process_set``, Horovod's order (see :func:`grouped_allreduce_async`).
        **kwargs: Any of those by name.

    Returns:
        A :class:`Handle`; :func:`synchronize` gives the reduced tensor (a new one).

    Raises:
        ValueError: No :func:`init` yet; both ``op`` and ``average``, or an unknown ``op``.
        NotImplementedError: ``Adasum`` was asked for on a non-global process set or a
            number of ranks that is not a power of two.
        HorovodArgumentError: A pending operation has this name on this rank, or the
            process set was not added or lacks this rank.
    """
    handle = grouped_allreduce_async([tensor], *args, **kwargs)
    handle.post = lambda results: results[0]
    return handle


def allreduce_async_(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Handle:
    """Start the in-place reduction of ``tensor``: :func:`allreduce_async` whose result is
    written into ``tensor`` when :func:`synchronize` returns it.

    Args:
        tensor: The tensor to reduce and overwrite.
        *args: As for :func:`allreduce_async`, after ``tensor``.
        **kwargs: The same by keyword.

    Returns:
        A :class:`Handle` whose result is ``tensor`` itself.

    Raises:
        ValueError: Called before :func:`init`, or ``op`` is invalid or given with
            ``average``.
        NotImplementedError: For ``op=Adasum`` where Horovod refuses it (a non-global set,
            a size not a power of two).
        HorovodArgumentError: Its name is in flight here already, or its process set cannot
            be used by this rank.
    """
    handle = grouped_allreduce_async([tensor], *args, **kwargs)
    handle.post = lambda results: _copied_into([tensor])(results)[0]
    return handle


def grouped_allgather_async(
    tensors: Iterable[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start the gathering of every rank's tensors, each concatenated along its first
    dimension in rank order.

    First dimensions may differ between ranks; the other dimensions and the dtype of each
    tensor may not. A 0-d tensor counts as one row. The inputs are not modified.

    Args:
        tensors: This rank's tensors, as many on every rank.
        name: The operation's name, matched across ranks (default: automatic).
        process_set: The ranks to gather from (default: every rank).

    Returns:
        A :class:`Handle`; :func:`synchronize` gives one new tensor per input.

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodArgumentError: ``name`` is pending on this rank already, or the set is not
            added or does not include this rank.
    """
    tensors = [t.reshape(1) if t.dim() == 0 else t for t in tensors]
    match = [[_dtype(t) for t in tensors], [list(t.shape[1:]) for t in tensors]]
    desc = _desc("allgather", match, [list(t.shape) for t in tensors], error=_refused(tensors))

    def run(comm, call, descs):
        return [
            kernels.allgather(comm, call, t, [d["s"][i][0] for d in descs])
            for i, t in enumerate(tensors)
        ]

    return Handle(*_submit(process_set, "allgather", name, desc, run))


def allgather_async(
    tensor: torch.Tensor,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start the concatenation of every rank's ``tensor`` along the first dimension.

    A one-tensor :func:`grouped_allgather_async`: first dimensions may differ, the rest of
    the shape and the dtype must match.

    Args:
        tensor: This rank's rows.
        name: A name for the operation (ranks match it); automatic if ``None``.
        process_set: Whose tensors are gathered (default: all ranks).

    Returns:
        A :class:`Handle`; its result is the gathered tensor, in rank order.

    Raises:
        ValueError: Before :func:`init`.
        HorovodArgumentError: The name is already pending, or the process set is not one
            this rank can use.
    """
    handle = grouped_allgather_async([tensor], name, process_set)
    handle.post = lambda results: results[0]
    return handle


def set_root(root_rank: int, process_set) -> tuple[int, str]:
    """``root_rank`` (a rank of ``init()``'s communicator, as in Horovod) as a rank of the
    process set, and why it cannot be (or "")."""
    ranks = resolve(process_set).ranks
    if root_rank not in ranks:
        return 0, f"root_rank {root_rank} is not in the process set (ranks {ranks})"
    return ranks.index(root_rank), ""


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start the broadcast of ``root_rank``'s ``tensor`` to every rank of the set.

    Every rank passes a tensor of the root's dtype and shape; none is modified.

    Args:
        tensor: The root's data; on the other ranks, a tensor of its dtype and shape.
        root_rank: The sender, a rank of :func:`init`'s communicator (not of the set), as in
            Horovod; it must be in the set.
        name: The operation's name, matched across ranks; automatic if not given.
        process_set: The ranks to broadcast to (default: all).

    Returns:
        A :class:`Handle`; :func:`synchronize` gives a new tensor holding the root's values.

    Raises:
        ValueError: :func:`init` not called yet.
        HorovodArgumentError: An operation of this name is pending here, or the set is not
            added or lacks this rank. A root outside the set is reported by
            :func:`synchronize`, on every rank.
    """
    root, error = set_root(root_rank, process_set)
    error = error or _refused([tensor])
    desc = _desc("broadcast", [root_rank, _dtype(tensor), list(tensor.shape)], [], error=error)

    def run(comm, call, descs):
        return kernels.broadcast(comm, call, tensor, root)

    return Handle(*_submit(process_set, "broadcast", name, desc, run))


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,  # a rank of init()'s communicator, as for broadcast_async
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start the in-place broadcast: :func:`broadcast_async`, with the root's values written
    into ``tensor`` by :func:`synchronize`.

    Args:
        tensor: The root's data, and the buffer overwritten on the other ranks.
        root_rank: The sending rank (of :func:`init`'s communicator).
        name: Matched across ranks; automatic when ``None``.
        process_set: The set to broadcast within (default: global).

    Returns:
        A :class:`Handle` whose result is ``tensor``.

    Raises:
        ValueError: Asked before :func:`init`.
        HorovodArgumentError: This name is in flight, or the process set is unusable here.
    """
    handle = broadcast_async(tensor, root_rank, name, process_set)
    handle.post = lambda result: _copied_into([tensor])([result])[0]
    return handle


def _splits(tensor, splits, size: int) -> tuple[list, str]:
    """The rows to send to each rank, and why they cannot be (or "")."""
    import torch

    rows = tensor.shape[0] if tensor.dim() else 0
    if splits is None:
        if rows % size:
            return [0] * size, f"the first dimension {rows} does not divide by {size} ranks"
        return [rows // size] * size, ""
    if isinstance(splits, torch.Tensor):
        if splits.dtype not in (torch.int32, torch.int64):
            return [0] * size, f"splits must be int32 or int64, got {splits.dtype}"
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != size or min(splits) < 0:
        return [0] * size, f"splits must hold {size} counts >= 0, got {splits}"
    if sum(splits) > rows:
        return [0] * size, f"splits sum to {sum(splits)}, more than the first dimension {rows}"
    return splits, ""


def alltoall_async(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet | None = global_process_set,
) -> Handle:
    """Start the exchange of rows: ``splits[i]`` rows of ``tensor`` go to the set's rank
    ``i``, and the rows received are concatenated in rank order.

    The dtype and every dimension but the first must match on every rank. The input is not
    modified.

    Args:
        tensor: The rows to send, of at least one dimension.
        splits: How many rows go to each rank of the set (int32 or int64 tensor, or a list;
            counts ``>= 0`` summing to at most the first dimension). Default: the first
            dimension in equal parts, which must divide by the set's size.
        name: The operation's name; ranks match it.
        process_set: The ranks that exchange (default: every rank).

    Returns:
        A :class:`Handle`; :func:`synchronize` gives ``(output, received_splits)``, the
        rows received and an int32 tensor of how many came from each rank.

    Raises:
        ValueError: :func:`init` has not run.
        HorovodArgumentError: The name is already pending, or the set is not added or not
            this rank's. Splits that do not fit, and a 0-d tensor, are reported by
            :func:`synchronize` on every rank.
    """
    import torch

    process_set = resolve(process_set)
    send, error = _splits(tensor, splits, process_set.size())
    if tensor.dim() == 0:
        error = "alltoall needs a tensor of at least one dimension"
    error = error or _refused([tensor])
    match = [_dtype(tensor), list(tensor.shape[1:])]
    desc = _desc("alltoall", match, [list(tensor.shape)], send, error)

    def run(comm, call, descs):
        received = [d["x"][comm.rank] for d in descs]
        output = kernels.alltoall(comm, call, tensor, send, received)
        return output, torch.tensor(received, dtype=torch.int32)

    return Handle(*_submit(process_set, "alltoall", name, desc, run))


def grouped_reducescatter_async(
    tensors: Iterable[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet | None = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start the reduce-scatter of each tensor: reduced over the set, of which this rank
    keeps its block of rows.

    The rows are split in rank order, the first ``rows % size`` ranks getting one row more,
    as Horovod splits them. Every rank passes tensors of the same dtypes and shapes, of at
    least one dimension. The inputs are not modified.

    Args:
        tensors: The tensors to reduce.
        name: The operation's name; ranks match it (default: automatic).
        op: ``Average`` (default) or ``Sum``, as Horovod allows.
        process_set: The ranks to reduce over and scatter to (default: all).
        prescale_factor: Multiplies each tensor before the reduction.
        postscale_factor: Multiplies each result.

    Returns:
        A :class:`Handle`; :func:`synchronize` gives this rank's block of each tensor, as a
        list of new tensors.

    Raises:
        ValueError: :func:`init` has not been called, or ``op`` is not a known reduction.
        HorovodArgumentError: A pending operation already has ``name`` here, or the set
            cannot be used by this rank. ``Adasum``, ``Min``, ``Max`` or ``Product``, and
            0-d tensors, are reported by :func:`synchronize`, on every rank.
    """
    tensors = list(tensors)
    process_set = resolve(process_set)
    horovod_op = reduce_op(None, op)
    mpi_op, post = _mpi_op(horovod_op, float(postscale_factor), process_set)
    pre = float(prescale_factor)
    shapes = [list(t.shape) for t in tensors]
    scalar = any(t.dim() == 0 for t in tensors)
    error = "reducescatter needs tensors of at least one dimension" if scalar else ""
    if horovod_op not in (Average, Sum):  # as Horovod
        error = error or "reducescatter supports only Average and Sum"
    error = error or _refused(tensors)
    match = [horovod_op, pre, float(postscale_factor), [_dtype(t) for t in tensors], shapes]
    desc = _desc("reducescatter", match, shapes, None, error)

    def run(comm, call, descs):
        return [kernels.reducescatter(comm, call, t, mpi_op, pre, post) for t in tensors]

    return Handle(*_submit(process_set, "reducescatter", name, desc, run))


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet | None = global_process_set,
    **scales: float,
) -> Handle:
    """Start the reduce-scatter of ``tensor``: a one-tensor
    :func:`grouped_reducescatter_async`.

    Args:
        tensor: The tensor to reduce; this rank keeps its block of rows.
        name: Matched across ranks; automatic when ``None``.
        op: ``Average`` or ``Sum``.
        process_set: Where to reduce (default: the global set).
        **scales: ``prescale_factor`` and ``postscale_factor``, as Horovod's.

    Returns:
        A :class:`Handle`; its result is this rank's block, a new tensor.

    Raises:
        ValueError: Before :func:`init`, or an unknown ``op``.
        HorovodArgumentError: ``Adasum`` (or ``Min``, ``Max``, ``Product``), from
            :func:`synchronize` on every rank.
        HorovodArgumentError: Its name is pending here already, or the set is not usable on
            this rank.
    """
    handle = grouped_reducescatter_async([tensor], name, op, process_set, **scales)
    handle.post = lambda results: results[0]
    return handle


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str,
    op: int,
    process_set: ProcessSet | None = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Start the reduction of a sparse COO tensor as Horovod does: two allgathers, of its
    indices and of its values.

    Args:
        tensor: A sparse COO tensor, of the same dense shape on every rank.
        name: The base of the two operations' names (``name.indices``, ``name.values``).
        op: ``Average`` divides the gathered values by the set's size; any other op sums.
        process_set: The ranks to reduce over (default: all).

    Returns:
        A function (Horovod's handle here) that waits and returns the sparse sum or average
        (every rank's entries, not coalesced). Call it, or pass it to :func:`synchronize`.

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodArgumentError: ``name.indices`` or ``name.values`` is already pending, or the
            set is unusable on this rank.
    """
    process_set = resolve(process_set)
    indices = allgather_async(
        tensor._indices().transpose(0, 1).contiguous(), f"{name}.indices", process_set
    )
    values = allgather_async(tensor._values(), f"{name}.values", process_set)

    def handle():
        gathered_values = synchronize(values)
        gathered_indices = synchronize(indices)
        if op == Average:
            gathered_values = gathered_values / process_set.size()
        return tensor.new(gathered_indices.transpose(0, 1), gathered_values, tensor.size())

    return handle


def in_engine(process_set, kind: str, name: str, match: list, body: Callable[[], Any]) -> Any:
    """Run ``body()`` (collectives on its own communicators) as the operation ``kind.name`` of
    the set's engine, so that it is matched by name with the others' operations (ranks that
    issue different ones get the same error instead of a wait); its result. A fixed name, not
    a count: ranks whose counts differ after a mismatch still match."""
    desc = _desc(kind, match, [])
    return synchronize(
        Handle(*_submit(process_set, kind, name, desc, lambda comm, call, descs: body()))
    )


def barrier(process_set: ProcessSet | None = global_process_set) -> None:
    """Wait until every rank of the set has called it.

    Matched by name like any operation: operations pending on every rank run
    meanwhile. The wait is bounded by ``MPISYNC_TIMEOUT``.

    Args:
        process_set: The ranks that meet (default: every rank).

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodArgumentError: The set was not added or does not hold this rank.
        HorovodInternalError: The other ranks wait for other operations (none pending on
            all), or a rank has called :func:`join`: the same error on every rank.
        mpisync.SyncTimeoutError: A rank did not arrive within ``MPISYNC_TIMEOUT`` (with
            ``MPISYNC_TIMEOUT_ABORT=0``; by default the job is aborted).
    """

    def run(comm, call, descs):
        call(comm.Ibarrier())

    synchronize(Handle(*_submit(process_set, "barrier", None, _desc("barrier", [], []), run)))


def join(device: int = -1) -> int:
    """Say that this rank has no more data, and wait until every rank has said so.

    Meanwhile this rank takes part in the other ranks' all-reduces with zeros (an average
    still divides by the whole set), as in Horovod, so ranks with uneven amounts of data
    finish together. Other operations that meet a joined rank fail on the ranks that
    issued them. ``join`` is on the global process set.

    Args:
        device: Horovod's device for its zero tensors; unused here (zeros are made on the
            CPU).

    Returns:
        The rank that joined last.

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodInternalError: The other ranks wait for operations that cannot run (none
            pending on every rank that has not joined).
        mpisync.SyncTimeoutError: A rank neither joined nor took part within
            ``MPISYNC_TIMEOUT`` (with ``MPISYNC_TIMEOUT_ABORT=0``).
    """
    return global_process_set.require_engine().join()
