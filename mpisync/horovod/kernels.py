"""The data movement of each Horovod collective, on CPU copies of the tensors, through
nonblocking MPI collectives waited for by ``call`` (mpisync's bounded wait).

Every function takes the communicator, ``call``, this rank's tensors and what every rank
described of its own (:mod:`mpisync.horovod.engine` agreed on those first), and returns new
tensors on the inputs' devices. Reductions run in the tensor's dtype, halves in float32;
scaling follows Horovod: integers in float64, halves in float32, truncated back.
"""

from __future__ import annotations

import math

import numpy as _np
from mpi4py import MPI

from ..transports import node, pairwise
from ..transports import policy as _policy
from ..transports.node import drive

__all__ = ["allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "scaled"]

_MPI_OPS = {"sum": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}
# alltoall's messages on the set's communicator (no other point-to-point message travels there)
_ALLTOALL_TAG = 3


def scaled(tensor, factor: float):
    """``tensor * factor`` in Horovod's arithmetic, in ``tensor``'s dtype (a new tensor)."""
    import torch

    if factor == 1.0:
        return tensor.clone()
    if not tensor.dtype.is_floating_point and not tensor.dtype.is_complex:
        return (tensor.to(torch.float64) * factor).to(tensor.dtype)
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return (tensor.to(torch.float32) * factor).to(tensor.dtype)
    return tensor * factor


def _host(tensor):
    return tensor.detach().to("cpu").contiguous()


def _raw(tensor):
    """The bytes of ``tensor`` (on the CPU, contiguous) as a uint8 numpy array."""
    import torch

    flat = _host(tensor).reshape(-1)
    if flat.numel() == 0:
        return _np.empty(0, dtype=_np.uint8)
    return flat.view(torch.uint8).numpy()


def _from_raw(raw, dtype, shape, device):
    """A tensor of ``dtype`` and ``shape`` on ``device`` holding ``raw``'s bytes (a uint8 array
    this call made): on the CPU, over ``raw``'s memory, yet not a torch view of another tensor,
    since autograd refuses in-place ops on views that a custom Function returns."""
    import torch

    if raw.size == 0:
        return torch.empty(shape, dtype=dtype, device=device)
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]  # C order
    storage = torch.from_numpy(raw).untyped_storage()
    out = torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)
    return out.to(device) if str(device) != "cpu" else out


def _row_bytes(tensor) -> int:
    """The bytes of one row of ``tensor`` (of a 0-d tensor, its one value): from the shape, so
    that a tensor of no rows has rows of a size too."""
    return tensor.element_size() * math.prod(tensor.shape[1:])


def _reducible(tensor, prescale: float):
    """``tensor`` scaled by ``prescale``, flat, on the CPU, in the dtype the reduction runs in
    (halves in float32): possibly the tensor's own memory, only to be read (a 25 MiB copy costs
    more than the reduce-scatter that reads it). Each torch call only where it is needed: a
    hundred tensors' worth of them cost a millisecond."""
    flat = tensor.detach().reshape(-1)
    if prescale != 1.0:
        flat = scaled(flat, prescale)
    wide = _wide(flat.dtype)
    return flat if flat.dtype == wide and flat.is_cpu else flat.to("cpu", wide)


def _wide(dtype):
    """The dtype ``dtype`` is reduced in: float32 for halves, else itself."""
    import torch

    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _postscaled(result, factor: float):
    """``result`` (a tensor this call made) times ``factor`` as :func:`scaled` computes it, in
    place where that gives the same values (float32, float64, complex): no new tensor."""
    import torch

    if factor == 1.0:
        return result
    if result.dtype in (torch.float32, torch.float64) or result.dtype.is_complex:
        return result.mul_(factor)
    return scaled(result, factor)


def _reduce_in_place(comm, call, array, op: str) -> None:
    """Reduce ``array`` over ``comm`` in place by :func:`mpisync.transports.node.reduce_steps`
    (the node's mechanism for its size, else ``MPI_Iallreduce``). Its size and dtype were
    agreed: every rank takes the same branch."""
    if array.size:
        drive(node.reduce_steps(comm, [array], _MPI_OPS[op]), call)


def allreduce(comm, call, tensors: list, op: str, prescale: float, postscale: float) -> list:
    """The reduction of each of ``tensors`` over ``comm`` (``op``: sum, min, max, prod), fused
    as Horovod fuses a group: the tensors reduced in one dtype are copied end to end into one
    new buffer, reduced by one collective (:func:`_reduce_in_place`), one buffer per dtype in the
    order the dtypes first appear (the same on every rank: dtypes and shapes were agreed).
    Returns a new tensor per input (over its part of a buffer where dtype and device allow)."""
    import torch

    groups: dict = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(_wide(tensor.dtype), []).append(i)
    results: list = [None] * len(tensors)
    for members in groups.values():
        # one copy (cat) for the group: the result is a new tensor, the inputs are only read
        buffer = torch.cat([_reducible(tensors[i], prescale) for i in members]).numpy()
        _reduce_in_place(comm, call, buffer, op)
        start = 0
        for i in members:
            tensor = tensors[i]
            # a tensor of its own over its part, not a torch view of the buffer (see _from_raw)
            result = torch.from_numpy(buffer[start : start + tensor.numel()].reshape(tensor.shape))
            start += tensor.numel()
            if result.dtype != tensor.dtype:
                result = result.to(tensor.dtype)
            result = _postscaled(result, postscale)
            results[i] = result if tensor.is_cpu else result.to(tensor.device)
    return results


def allgather(comm, call, tensor, rows: list):
    """Every rank's ``tensor`` along the first dimension (``rows``: each rank's count)."""
    row = _row_bytes(tensor)
    counts = [r * row for r in rows]
    displs = [sum(counts[:i]) for i in range(len(counts))]
    recv = _np.empty(sum(counts), dtype=_np.uint8)
    call(comm.Iallgatherv(_raw(tensor), [recv, (counts, displs), MPI.BYTE]))
    trailing = tuple(tensor.shape[1:]) if tensor.dim() else ()
    return _from_raw(recv, tensor.dtype, (sum(rows), *trailing), tensor.device)


def broadcast(comm, call, tensor, root: int):
    """``root``'s ``tensor``."""
    raw = _raw(tensor).copy()
    if raw.size:
        call(comm.Ibcast(raw, root=root))
    return _from_raw(raw, tensor.dtype, tuple(tensor.shape), tensor.device)


def alltoall(comm, call, tensor, send_rows: list, recv_rows: list):
    """Rows ``send_rows[i]`` of ``tensor`` to rank i, ``recv_rows[i]`` rows from rank i: one
    message each way per peer where :mod:`mpisync.transports.policy` says so (a set of up to a
    node's worth of ranks, :mod:`mpisync.transports.pairwise`), else one ``Ialltoallv``."""
    row = _row_bytes(tensor)
    send = [r * row for r in send_rows]
    recv_counts = [r * row for r in recv_rows]
    raw = _raw(tensor)
    recv = _np.empty(sum(recv_counts), dtype=_np.uint8)
    if _policy.choose(_policy.ALLTOALL, 0, comm.size, _policy.LIST) == _policy.PAIRWISE:
        posted = pairwise.post(
            comm, _ALLTOALL_TAG, pairwise.pieces(recv, recv_counts), pairwise.pieces(raw, send)
        )
        for request in posted:  # every one posted: waiting in any order cannot deadlock
            call(request)
    else:
        sdispls = [sum(send[:i]) for i in range(len(send))]
        rdispls = [sum(recv_counts[:i]) for i in range(len(recv_counts))]
        call(
            comm.Ialltoallv(
                [raw, (send, sdispls), MPI.BYTE], [recv, (recv_counts, rdispls), MPI.BYTE]
            )
        )
    return _from_raw(recv, tensor.dtype, (sum(recv_rows), *tensor.shape[1:]), tensor.device)


def scatter_rows(first: int, size: int) -> list:
    """How reducescatter splits a first dimension: the first ``first % size`` ranks one more."""
    return [first // size + (1 if r < first % size else 0) for r in range(size)]


def reducescatter(comm, call, tensor, op: str, prescale: float, postscale: float):
    """This rank's block of rows of the reduction of ``tensor`` (rows split as
    :func:`scatter_rows`). On one node, at the sizes :mod:`mpisync.transports.policy` sends by
    cross-memory, with as many rows for every rank,
    each rank reads its block of its peers' tensors by cross-memory and reduces it
    (:func:`mpisync.transports.node.reduce_scatter_steps`); else, or where that path is not
    open, ``MPI_Ireduce_scatter``."""
    import torch

    array = _reducible(tensor, prescale).numpy()
    rows = scatter_rows(tensor.shape[0], comm.size)
    per_row = math.prod(tensor.shape[1:])
    counts = [r * per_row for r in rows]
    out = _np.empty(counts[comm.rank], dtype=array.dtype)
    # Shape and dtype were agreed, so every rank takes the same path; with equal rows, the node
    # mechanism's equal shares are the blocks of rows.
    equal = len(set(rows)) == 1
    done, _ = drive(node.reduce_scatter_steps(comm, array, out, _MPI_OPS[op], equal), call)
    if array.size and not done:
        call(comm.Ireduce_scatter(array, out, counts, op=_MPI_OPS[op]))
    # numpy's reshape, not torch's: the result is not a torch view (see _from_raw)
    block = torch.from_numpy(out.reshape(rows[comm.rank], *tensor.shape[1:])).to(tensor.dtype)
    return _postscaled(block, postscale).to(tensor.device)
