"""Horovod's Adasum (adaptive summation) all-reduce, with Horovod's algorithm and order of
operations (``horovod/common/ops/adasum/adasum.h``), on numpy views of CPU copies of the tensors.

Vector halving, distance doubling over the set's ranks (a power of two): at level ``1, 2, 4...``
a rank and its neighbour ``rank ^ level`` swap halves of the part each still holds, and each
combines its half of the pair ``(a, b)`` as ``(1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b``
(a coefficient stays 1 where its squared norm is below ``sqrt(DBL_MIN)``), the dot product and
squared norms of each tensor summed in float64 over the ``2 * level`` ranks that hold its pieces;
then the halves travel back in the reverse order. The tensors of one dtype are fused end to end,
as Horovod fuses a group. float32 and float64 combine in float64; float16 as Horovod's AVX kernel
does (float32 coefficients, a multiply then a fused multiply-add in float32).
"""

from __future__ import annotations

import sys
import warnings

import numpy as _np
from mpi4py import MPI

from . import kernels

__all__ = ["check", "allreduce"]

# the point-to-point messages of a run on the set's communicator (alltoall's use 3)
_TAG = 5
_CHUNK_BYTES = 1 << 30  # Horovod's HOROVOD_ADASUM_MPI_CHUNK_SIZE default
_SQRT_DBL_MIN = sys.float_info.min**0.5
_DTYPES = ("float16", "float32", "float64")


def check(is_global: bool, global_size: int, tensors: list) -> None:
    """Refuse what Horovod's ``op=Adasum`` refuses, raising on the caller's rank at once as
    Horovod does (every rank shares these facts): a process set other than the global one, a
    world that is not a power of two (for tensors off the CPU too), a bfloat16 tensor; warn,
    as Horovod built without NCCL does, that tensors off the CPU are reduced in CPU memory.

    Args:
        is_global: Whether the operation's process set is the global one.
        global_size: The size of :func:`init`'s communicator.
        tensors: The operation's tensors.

    Raises:
        NotImplementedError: A non-global process set, or a size not a power of two.
        ValueError: A bfloat16 tensor (Horovod's "Tensor type ... is not supported").
    """
    if not is_global:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    if any(t.device.type != "cpu" for t in tensors):
        warnings.warn(
            "Adasum reduction does not currently support GPU reduction using MPI. Tensors are "
            "copied to CPU memory instead. To use Adasum for GPU reduction, please compile "
            "Horovod with HOROVOD_GPU_OPERATIONS=NCCL.",
            stacklevel=4,
        )
    # Horovod skips this check for GPU tensors and then fails inside MPI: refused for all here
    if global_size & (global_size - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    for tensor in tensors:
        if str(tensor.dtype) == "torch.bfloat16":  # Horovod has no bfloat16 kernel at all
            raise ValueError("Tensor type torch.BFloat16Tensor is not supported.")


def allreduce(comm, call, tensors: list, prescale: float, postscale: float) -> list:
    """The Adasum of each of ``tensors`` over ``comm`` (its size a power of two), scaled by
    ``prescale`` before and ``postscale`` after as Horovod scales (halves in float32).

    Args:
        comm: The set's communicator (its nonblocking calls waited for by ``call``).
        call: Waits for a request, under mpisync's timeout.
        tensors: This rank's tensors (the ranks agreed on their dtypes and shapes).
        prescale: Horovod's ``prescale_factor``.
        postscale: Horovod's ``postscale_factor``.

    Returns:
        A new tensor per input, on the input's device.

    Raises:
        TypeError: A tensor that is not float16, float32 or float64 (Horovod's "Unsupported
            data type"), before any data moves.
    """
    import torch

    for tensor in tensors:
        if str(tensor.dtype).removeprefix("torch.") not in _DTYPES:
            raise TypeError(f"Unsupported data type: Adasum reduces {', '.join(_DTYPES)} only")
    groups: dict = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault(tensor.dtype, []).append(i)
    results: list = [None] * len(tensors)
    for members in groups.values():
        flat = [tensors[i].detach().to("cpu").reshape(-1) for i in members]
        if prescale != 1.0:
            flat = [kernels.scaled(t, prescale) for t in flat]
        buffer = torch.cat(flat).numpy()
        counts = [tensors[i].numel() for i in members]
        if comm.size > 1:
            fused_allreduce(comm, call, buffer, counts)
        start = 0
        for i, count in zip(members, counts):
            tensor = tensors[i]
            result = torch.from_numpy(buffer[start : start + count].reshape(tensor.shape))
            start += count
            result = kernels.scaled(result, postscale) if postscale != 1.0 else result
            results[i] = result if tensor.is_cpu else result.to(tensor.device)
    return results


def _split(rank_is_right: bool, counts: list, my_count: int, nghr_count: int) -> list:
    """Horovod's split of the tensors' counts at one level: ``counts`` becomes what this rank
    keeps of each tensor; returns what its neighbour keeps."""
    nghr = [0] * len(counts)
    so_far = 0
    for i, count in enumerate(counts):
        if rank_is_right:  # the neighbour keeps the first nghr_count elements
            if so_far <= nghr_count:
                nghr[i] = count if so_far + count <= nghr_count else nghr_count - so_far
                counts[i] = count - nghr[i]
            so_far += nghr[i]
        else:  # this rank keeps the first my_count elements
            if so_far <= my_count:
                if so_far + count > my_count:
                    nghr[i] = count - (my_count - so_far)
                    counts[i] = my_count - so_far
            else:
                nghr[i], counts[i] = count, 0
            so_far += counts[i]
    return nghr


def _sendrecv(comm, call, send, dest: int, recv, chunks: int) -> None:
    """Send ``send`` to and receive ``recv`` from ``dest`` in ``chunks`` messages each way (the
    same count on every rank, empty ones too: each message is one of the guarded communicator's
    calls, which every rank must make alike)."""
    out, into = send.view(_np.uint8), recv.view(_np.uint8)
    out_step = -(-send.size // chunks) * send.itemsize
    into_step = -(-recv.size // chunks) * recv.itemsize
    for k in range(chunks):
        call(
            comm.Isendrecv(
                [out[k * out_step : (k + 1) * out_step], MPI.BYTE],
                dest,
                _TAG,
                [into[k * into_step : (k + 1) * into_step], MPI.BYTE],
                dest,
                _TAG,
            )
        )


def fused_allreduce(comm, call, buffer, counts: list) -> None:
    """Horovod's ``FusedAllreduce`` on ``buffer`` in place: ``counts`` elements per tensor, end
    to end; every rank of ``comm`` (a power of two) calls it with the same counts.

    Args:
        comm: The communicator.
        call: Waits for a request.
        buffer: A 1-d float16, float32 or float64 array: this rank's tensors, then the result.
        counts: The element count of each tensor in ``buffer``.
    """
    rank, size = comm.rank, comm.size
    chunks = max(-(-buffer.nbytes // _CHUNK_BYTES), 1)  # Horovod's chunk size at most
    recv = _np.empty_like(buffer)
    counts = list(counts)
    start, my_count, given = 0, sum(counts), []
    level = 1
    while level < size:  # reduce-scatter: halve the part held, combine with the neighbour's
        right = bool(rank & level)
        first = my_count >> 1
        my_count, nghr_count = (my_count - first, first) if right else (first, my_count - first)
        given.append(_split(right, counts, my_count, nghr_count))
        send_at, recv_at = (0, nghr_count) if right else (my_count, 0)
        _sendrecv(
            comm,
            call,
            buffer[start + send_at : start + send_at + nghr_count],
            rank ^ level,
            recv[start + recv_at : start + recv_at + my_count],
            chunks,
        )
        if right:
            start += nghr_count
        span = slice(start, start + my_count)
        _combine(comm, call, buffer[span], recv[span], counts, level, not right)
        level <<= 1
    level = size >> 1
    while level > 0:  # allgather: the parts travel back, distance halving
        nghr = given.pop()
        nghr_count = sum(nghr)
        for i, count in enumerate(nghr):
            counts[i] += count
        right = bool(rank & level)
        at = start - nghr_count if right else start + my_count
        mine, theirs = buffer[start : start + my_count], buffer[at : at + nghr_count]
        _sendrecv(comm, call, mine, rank ^ level, theirs, chunks)
        if right:
            start -= nghr_count
        my_count += nghr_count
        level >>= 1


def _group_sum(comm, call, values, width: int) -> None:
    """Sum ``values`` (float64) in place over the ``width`` ranks (a power of two) that share
    this rank's bits above ``width``: recursive doubling, the same sums on every one of them."""
    other = _np.empty_like(values)
    distance = 1
    while distance < width:
        _sendrecv(comm, call, values, comm.rank ^ distance, other, 1)
        values += other
        distance <<= 1


def _combine(comm, call, a, b, counts: list, level: int, left: bool) -> None:
    """Horovod's ``FusedPairwiseReduceWithComm``: ``a`` (this rank's part) becomes the Adasum
    combination of ``a`` and ``b`` (the neighbour's), per tensor (``counts``), the dot
    products and norms summed over the ``2 * level`` ranks that hold the tensors' pieces."""
    stats = _np.zeros(3 * len(counts))
    at = 0
    for i, count in enumerate(counts):
        x, y = a[at : at + count].astype(_np.float64), b[at : at + count].astype(_np.float64)
        mine, theirs = float(x @ x), float(y @ y)
        stats[3 * i : 3 * i + 3] = (x @ y, mine, theirs) if left else (x @ y, theirs, mine)
        at += count
    _group_sum(comm, call, stats, 2 * level)
    at = 0
    for i, count in enumerate(counts):
        dot, left_norm, right_norm = (float(v) for v in stats[3 * i : 3 * i + 3])
        a_norm, b_norm = (left_norm, right_norm) if left else (right_norm, left_norm)
        a_coeff = 1.0 - dot / a_norm * 0.5 if a_norm >= _SQRT_DBL_MIN else 1.0
        b_coeff = 1.0 - dot / b_norm * 0.5 if b_norm >= _SQRT_DBL_MIN else 1.0
        scaled_add(a[at : at + count], a_coeff, b[at : at + count], b_coeff)
        at += count


def scaled_add(a, a_coeff: float, b, b_coeff: float) -> None:
    """``a = a_coeff * a + b_coeff * b`` in place, in Horovod's arithmetic: in float64 for
    float32 and float64; for float16 as its AVX kernel, the coefficients in float32, ``a``'s
    product rounded to float32, then ``b``'s added by a fused multiply-add."""
    if a.dtype == _np.float16:
        head = _np.float32(a_coeff) * a.astype(_np.float32)
        fused = head.astype(_np.float64) + float(_np.float32(b_coeff)) * b.astype(_np.float64)
        a[...] = fused.astype(_np.float32).astype(_np.float16)
        return
    a[...] = a_coeff * a.astype(_np.float64) + b_coeff * b.astype(_np.float64)
