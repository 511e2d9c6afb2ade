"""Horovod's collective operations on tensors and objects, over ``hvd.init()``'s communicator.

Every operation runs at once, in the calling order, which must be the same on every rank (as
for any MPI program: Horovod matches operations by name instead). The ``*_async`` forms run at
once too and return a handle that :func:`synchronize` resolves. Reductions go through
:class:`~mpisync.GradSync`, broadcasts through :class:`~mpisync.ParamSync`: validation, errors
(the same on every rank) and timeouts are mpisync's.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidParamError
from ..params.agreement import allgather_bytes
from ..state import _broadcast_bytes
from . import objects as _objects
from .compression import Compression
from .context import check_process_set, require

__all__ = [
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "allgather",
    "allgather_async",
    "allgather_object",
    "barrier",
    "synchronize",
    "poll",
]

# Horovod's ReduceOp values
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OPS = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}


def reduce_op(average=None, op=None) -> str:
    """mpisync's name of Horovod's ``op`` (``average=True``/``False``: the old way of saying
    Average or Sum; neither: Average)."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError(
            "mpisync.horovod does not provide Adasum (Horovod's adaptive summation): use "
            "op=hvd.Average or hvd.Sum"
        )
    if op not in _OPS:
        raise ValueError(f"unknown reduction op {op!r}: use hvd.Average, Sum, Min, Max or Product")
    return _OPS[op]


def _fresh(tensor):
    """A contiguous copy that owns its memory (the result of the out-of-place forms)."""
    import torch

    return tensor.detach().clone(memory_format=torch.contiguous_format)


def _scaled(tensors, factor) -> None:
    if factor != 1.0:
        for t in tensors:
            t.mul_(factor)


def grouped_allreduce_(
    tensors,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """All-reduce every tensor of ``tensors`` in place, in one call; return them."""
    check_process_set(process_set)
    mop = reduce_op(average, op)
    context = require()
    tensors = list(tensors)
    base = name or "tensor"
    names = [base] if len(tensors) == 1 else [f"{base}.{i:06d}" for i in range(len(tensors))]
    _scaled(tensors, prescale_factor)
    context.reducer(mop).allreduce(dict(zip(names, tensors)))
    _scaled(tensors, postscale_factor)
    return tensors


def grouped_allreduce(
    tensors,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """The all-reduce of each tensor, as new tensors (the inputs are left as they are)."""
    packed = [compression.compress(t) for t in tensors]
    out = [_fresh(t) for t, _ in packed]
    grouped_allreduce_(out, average, name, op, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(out, packed)]


def allreduce_(
    tensor,
    average=None,
    name=None,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """All-reduce ``tensor`` in place over every rank (default: the average); return it."""
    grouped_allreduce_([tensor], average, name, op, prescale_factor, postscale_factor, process_set)
    return tensor


def allreduce(
    tensor,
    average=None,
    name=None,
    compression=Compression.none,
    op=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    process_set=None,
):
    """The all-reduce of ``tensor`` over every rank (default: the average), as a new tensor."""
    return grouped_allreduce(
        [tensor], average, name, compression, op, prescale_factor, postscale_factor, process_set
    )[0]


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """Make ``tensor`` root_rank's, in place; return it."""
    check_process_set(process_set)
    require().syncer(root_rank).sync({name or "tensor": tensor})
    return tensor


def broadcast(tensor, root_rank, name=None, process_set=None):
    """root_rank's ``tensor``, as a new tensor (the input is left as it is)."""
    return broadcast_(_fresh(tensor), root_rank, name, process_set)


def _exchange(root_rank: int, name: str, exchange):
    """Run ``exchange(comm, call)`` on root_rank's broadcaster under mpisync's timeout."""
    return require().syncer(root_rank)._collective_exchange(f"{name} exchange", [name], exchange)


def broadcast_object(obj: Any = None, root_rank: int = 0, name=None, process_set=None):
    """root_rank's ``obj`` on every rank, sent in a safe encoding (never pickle): numbers,
    strings, None, lists, tuples, dicts, numpy arrays and torch tensors
    (:mod:`mpisync.horovod.objects`)."""
    check_process_set(process_set)
    label = name or "broadcast_object"

    def exchange(comm, call):
        payload = b""
        if comm.rank == root_rank:
            try:
                payload = b"o" + _objects.encode(obj)
            # whatever fails (a meta tensor, a sparse one, a user's type), root's failure travels
            # instead of its object: no rank waits
            except Exception as exc:  # noqa: BLE001
                payload = b"e" + f"rank {root_rank}: cannot send {exc}".encode()
        data = _broadcast_bytes(comm, payload, root_rank, call)
        if data[:1] == b"e":
            raise InvalidParamError(f"mpisync: broadcast_object: {data[1:].decode()}")
        return _objects.decode(data[1:])

    return _exchange(root_rank, label, exchange)


def allgather_object(obj: Any, name=None, process_set=None) -> list:
    """Every rank's ``obj``, in rank order, sent in the safe encoding of
    :func:`broadcast_object`."""
    check_process_set(process_set)
    label = name or "allgather_object"

    def exchange(comm, call):
        try:
            payload = b"o" + _objects.encode(obj)
        except Exception as exc:  # noqa: BLE001 - whatever it is, every rank learns it
            payload = b"e" + f"rank {comm.rank}: cannot send {exc}".encode()
        parts = allgather_bytes(comm, payload, call)
        errors = [p[1:].decode() for p in parts if p[:1] == b"e"]
        if errors:
            raise InvalidParamError("mpisync: allgather_object: " + "; ".join(errors))
        return [_objects.decode(p[1:]) for p in parts]

    return _exchange(0, label, exchange)


def allgather(tensor, name=None, process_set=None):
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order (first
    dimensions may differ; the others and the dtype may not)."""
    import torch

    parts = allgather_object(
        tensor.detach().reshape(1) if tensor.dim() == 0 else tensor, name, process_set
    )
    described = {(str(p.dtype), tuple(p.shape[1:])) for p in parts}
    if len(described) > 1:
        shown = ", ".join(f"rank {r}: {p.dtype} {tuple(p.shape)}" for r, p in enumerate(parts))
        raise InvalidParamError(
            f"mpisync: allgather: dtypes or trailing dimensions differ between ranks: {shown}"
        )
    return torch.cat(parts).to(tensor.device)


def barrier(process_set=None) -> None:
    """Wait until every rank has called it (bounded by mpisync's timeout)."""
    check_process_set(process_set)
    _exchange(0, "barrier", lambda comm, call: call(comm.Ibarrier()))


class _Handle:
    """What an ``*_async`` operation returns: it already ran; :func:`synchronize` gives the
    result."""

    def __init__(self, result):
        self.result = result


def allreduce_async(tensor, *args, **kwargs) -> _Handle:
    """:func:`allreduce`, run now; its handle."""
    return _Handle(allreduce(tensor, *args, **kwargs))


def allreduce_async_(tensor, *args, **kwargs) -> _Handle:
    """:func:`allreduce_`, run now; its handle."""
    return _Handle(allreduce_(tensor, *args, **kwargs))


def broadcast_async(tensor, root_rank, *args, **kwargs) -> _Handle:
    """:func:`broadcast`, run now; its handle."""
    return _Handle(broadcast(tensor, root_rank, *args, **kwargs))


def broadcast_async_(tensor, root_rank, *args, **kwargs) -> _Handle:
    """:func:`broadcast_`, run now; its handle."""
    return _Handle(broadcast_(tensor, root_rank, *args, **kwargs))


def allgather_async(tensor, *args, **kwargs) -> _Handle:
    """:func:`allgather`, run now; its handle."""
    return _Handle(allgather(tensor, *args, **kwargs))


def poll(handle: _Handle) -> bool:
    """Whether the operation of ``handle`` is done: always, operations run at once."""
    return True


def synchronize(handle: _Handle):
    """The result of the operation of ``handle``."""
    return handle.result
