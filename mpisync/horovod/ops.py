"""Horovod's asynchronous operations: each is submitted to its process set's
:class:`~mpisync.horovod.engine.Engine` and returns a handle; :func:`synchronize` waits for it,
:func:`poll` says whether it is done. The operations match by name across ranks (unnamed ones
by a per-kind count, as Horovod names them); a description of every tensor travels with the
name, so ranks that disagree get the same error.

The differentiable forms (``allreduce``, ``allgather``, ...) are in
:mod:`mpisync.horovod.autograd`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import kernels
from .engine import Op
from .process_sets import global_process_set, resolve

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

# Horovod's ReduceOp values
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OPS = {Sum: "sum", Min: "min", Max: "max", Product: "prod"}


def reduce_op(average=None, op=None) -> int:
    """Horovod's ``op`` from ``op`` and the older ``average=True/False`` (neither: Average)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            "mpisync.horovod does not provide Adasum (Horovod's adaptive summation): use "
            "op=hvd.Average or hvd.Sum"
        )
    if op not in (Average, *_OPS):
        raise ValueError(f"unknown reduction op {op!r}: use hvd.Average, Sum, Min, Max or Product")
    return op


def _mpi_op(op: int, postscale: float, process_set) -> tuple[str, float]:
    """mpisync's reduction and the postscale factor: an average is a sum scaled after."""
    if op == Average:
        return "sum", postscale / process_set.size()
    return _OPS[op], postscale


class Handle:
    """What an ``*_async`` operation returns; :func:`synchronize` gives its result."""

    def __init__(self, engine, op: Op, post: Callable[[Any], Any] = lambda result: result):
        self.engine, self.op, self.post = engine, op, post


def poll(handle: Handle) -> bool:
    """Whether the operation of ``handle`` is done (then :func:`synchronize` does not wait)."""
    return handle.engine.poll(handle.op)


def synchronize(handle):
    """Wait for the operation of ``handle``; its result (its error, raised on every rank)."""
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
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=global_process_set,
) -> Handle:
    """Submit the reduction of each tensor of ``tensors``; the handle's result is the list of
    reduced tensors (new; the inputs are left as they are)."""
    tensors, process_set = list(tensors), resolve(process_set)
    horovod_op = reduce_op(average, op)
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
        return [kernels.allreduce(comm, call, t, mpi_op, pre, post) for t in tensors]

    return Handle(*_submit(process_set, "allreduce", name, desc, run))


def _copied_into(targets):
    def post(results):
        for target, result in zip(targets, results):
            target.data.copy_(result)
        return targets

    return post


def grouped_allreduce_async_(tensors, *args, **kwargs) -> Handle:
    """:func:`grouped_allreduce_async` whose result is written into ``tensors``."""
    tensors = list(tensors)
    handle = grouped_allreduce_async(tensors, *args, **kwargs)
    handle.post = _copied_into(tensors)
    return handle


def allreduce_async(tensor, *args, **kwargs) -> Handle:
    """Submit the reduction of ``tensor`` (default: the average over the set)."""
    handle = grouped_allreduce_async([tensor], *args, **kwargs)
    handle.post = lambda results: results[0]
    return handle


def allreduce_async_(tensor, *args, **kwargs) -> Handle:
    """:func:`allreduce_async` whose result is written into ``tensor``."""
    handle = grouped_allreduce_async([tensor], *args, **kwargs)
    handle.post = lambda results: _copied_into([tensor])(results)[0]
    return handle


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """Submit the concatenation of every rank's tensors along their first dimension."""
    tensors = [t.reshape(1) if t.dim() == 0 else t for t in tensors]
    match = [[_dtype(t) for t in tensors], [list(t.shape[1:]) for t in tensors]]
    desc = _desc("allgather", match, [list(t.shape) for t in tensors], error=_refused(tensors))

    def run(comm, call, descs):
        return [
            kernels.allgather(comm, call, t, [d["s"][i][0] for d in descs])
            for i, t in enumerate(tensors)
        ]

    return Handle(*_submit(process_set, "allgather", name, desc, run))


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Submit the concatenation of every rank's ``tensor`` along the first dimension."""
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


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """Submit the broadcast of root_rank's ``tensor``; the result is a new tensor."""
    root, error = set_root(root_rank, process_set)
    error = error or _refused([tensor])
    desc = _desc("broadcast", [root_rank, _dtype(tensor), list(tensor.shape)], [], error=error)

    def run(comm, call, descs):
        return kernels.broadcast(comm, call, tensor, root)

    return Handle(*_submit(process_set, "broadcast", name, desc, run))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> Handle:
    """:func:`broadcast_async` whose result is written into ``tensor``."""
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


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Submit the exchange: ``splits[i]`` rows (default: equal parts) of ``tensor`` to rank i.
    The result is ``(output, received_splits)``."""
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
    tensors,
    name=None,
    op=Average,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
) -> Handle:
    """Submit the reduction of each tensor, of which this rank keeps its block of rows (the
    first ``rows % size`` ranks one row more)."""
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


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, **scales):
    """Submit the reduce-scatter of ``tensor`` (see :func:`grouped_reducescatter_async`)."""
    handle = grouped_reducescatter_async([tensor], name, op, process_set, **scales)
    handle.post = lambda results: results[0]
    return handle


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduce a sparse tensor as Horovod does: allgather its indices and its values; the
    handle is a function returning the (uncoalesced) sparse sum or average."""
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


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the set has called it; pending operations every rank has
    submitted run meanwhile."""

    def run(comm, call, descs):
        call(comm.Ibarrier())

    synchronize(Handle(*_submit(process_set, "barrier", None, _desc("barrier", [], []), run)))


def join(device=-1) -> int:
    """This rank has no more data: it takes part in the others' all-reduces with zeros until
    every rank has joined. Returns the rank that joined last."""
    return global_process_set.require_engine().join()
