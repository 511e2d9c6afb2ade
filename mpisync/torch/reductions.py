"""The reducing operations as :class:`~mpisync.torch.op.Op`: all_reduce (+coalesced, sparse),
reduce, reduce_scatter (+tensor, unequal pieces)."""

from __future__ import annotations

import numpy as _np
import torch
from mpi4py import MPI

from ..transports.node import reduce_scatter_steps as node_reduce_scatter_steps
from ..transports.node import reduce_steps as node_reduce_steps
from .buffers import SCRATCH, ReduceBuffer, in_place_array, reduce_problem, reduction
from .movement import REDUCE_SCATTER_TAG
from .op import Once, Op, dtype_code, fold, joined, overlapping, shape_text
from .refusals import refusing

__all__ = ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "sparse_all_reduce"]


def _op_of(opts):
    from torch.distributed import ReduceOp

    return ReduceOp.SUM if opts is None else opts.reduceOp


def _prepare(tensors, opts) -> tuple:
    """``(Reduction or None, problem or None, op name)`` for ``tensors`` under ``opts``."""
    red, problem = reduction(_op_of(opts))
    if red is not None:
        problem = reduce_problem(red, tensors)
    return red, problem, red.name if red is not None else str(_op_of(opts))


def _signature(tensors, red, *extra) -> list:
    code = red.code if red is not None else 0
    if len(tensors) == 1:  # the common case, without folding
        return [dtype_code(tensors[0].dtype), tensors[0].numel(), code, *extra]
    return [
        fold(dtype_code(t.dtype) for t in tensors),
        fold(t.numel() for t in tensors),
        code,
        *extra,
    ]


@refusing("all_reduce", sparse=True)
def all_reduce(size: int, tensors, opts, kind: str = "all_reduce", root=None) -> Op:
    """Every tensor of ``tensors`` reduced over the ranks, in place (one ``Iallreduce`` each);
    ``root``: the ``reduce`` that serves (its root is part of what the ranks agree on)."""
    tensors = list(tensors)
    if root is None and any(t.layout == torch.sparse_coo for t in tensors):
        return sparse_all_reduce(size, tensors, opts)
    red, problem, name = _prepare(tensors, opts)

    def describe() -> str:
        return f"{shape_text(tensors)}, op {name}" + (f", root {root}" if root is not None else "")

    signature = _signature(tensors, red, *(() if root is None else (root,)))
    if problem is None and root is not None and not 0 <= root < size:
        problem = f"root {root} is not a rank of this group of {size}"
    if problem is not None:
        return Op(kind, signature, describe, None, tensors, problem)
    mpi_op = red.mpi_op

    def prepare() -> tuple:
        if len(tensors) > 1 and overlapping(tensors):
            # One tensor twice, or views that overlap: each reduced in its own copy, written back
            # in order (as gloo's flattened buffer is).
            return None, [ReduceBuffer(t, red, size, stage=True) for t in tensors]
        arrays = [in_place_array(t, red) for t in tensors]
        if all(a is not None for a in arrays):
            return arrays, []
        return None, [ReduceBuffer(t, red, size) for t in tensors]

    ready = Once(prepare)  # on the caller while the argument check is in flight

    def body(comm):
        arrays, buffers = ready()
        if arrays is None:
            arrays = [b.start() for b in buffers]
        # the node's mechanism or MPI's, by what the argument check compares: alike everywhere
        yield from node_reduce_steps(comm, arrays, mpi_op, root=root)
        for b in buffers:
            b.finish()

    return Op(kind, signature, describe, body, tensors, prepare=ready)


@refusing("reduce")
def reduce(rank: int, size: int, tensors, opts) -> Op:
    """``tensors`` reduced over the ranks into ``opts.rootRank``'s. The other ranks' tensors hold
    the result too (torch leaves them unspecified; gloo leaves partial sums there): an in-place
    all-reduce costs what the all-reduce does, where the others' results into scratch buffers
    cost more (a copy, and new pages on every call) and MPICH's Ireduce of large messages
    more still (docs/allreduce.md, the backend's bench rows). A large tensor on one node
    goes by cross-memory, to the root alone: the others' tensors then hold the result in their
    own share of it only."""
    # all_reduce itself, not its guard: this one's already looked at the tensors
    return all_reduce.__wrapped__(size, tensors, opts, "reduce", root=opts.rootRank)


@refusing("reduce_scatter_tensor")
def reduce_scatter_tensor(
    rank: int, size: int, output: torch.Tensor, input: torch.Tensor, opts
) -> Op:
    """``input`` reduced over the ranks; this rank keeps its ``output``-sized block."""
    red, problem, name = _prepare([input, output], opts)

    def describe() -> str:
        return f"input {shape_text([input])}, output {shape_text([output])}, op {name}"

    signature = _signature([output], red, dtype_code(input.dtype))
    if problem is None and input.numel() != output.numel() * size:
        problem = (
            f"input has {input.numel()} elements, expected {output.numel() * size} "
            f"({size} x the output's {output.numel()})"
        )
    if problem is None and input.dtype != output.dtype:
        problem = f"input is {input.dtype}, output {output.dtype}"
    if problem is not None:
        return Op("reduce_scatter_tensor", signature, describe, None, output, problem)
    shared = overlapping([input, output])
    whole = in_place_array(input, red) if shared else None
    if whole is not None and in_place_array(output, red) is not None and _is_block(output, input):
        return _into_block(rank, size, output, input, whole, red, signature, describe)
    if not shared and size == 2 and red.name in _COMBINE:
        whole, out = in_place_array(input, red), in_place_array(output, red)
        if whole is not None and out is not None:
            return _exchanged(rank, output, whole, out, red, signature, describe)
    send = ReduceBuffer(input, red, stage=shared)  # any other overlap: a copy of the input
    result = ReduceBuffer(output, red, size)

    def body(comm):
        arrays = send.start(), result.start()
        if not (yield from _crossed(comm, size, *arrays, red)):
            yield [comm.Ireduce_scatter_block(*arrays, red.mpi_op)], True
        send.finish(write=False)
        result.finish()

    return Op("reduce_scatter_tensor", signature, describe, body, output)


def _crossed(comm, size: int, whole, out, red):
    """The reduce-scatter of ``whole`` (an array, or equal pieces laid end to end) into ``out`` by
    the node's mechanism where :mod:`mpisync.transports.node` gives one; returns whether it ran.
    The size and the reduction are what the argument check compares, so every rank decides
    alike, whichever form of the call each passed."""
    return (yield from node_reduce_scatter_steps(comm, whole, out, red.mpi_op))


def _into_block(rank, size, output, input, whole, red, signature, describe) -> Op:
    """FSDP's form, the output one block of the input (``whole``, reduced where it is).

    Where the group has 2 ranks and each one's output is its own block, each sends the other
    the block that is the other's and combines the one it receives into its output: MPI's
    reduce-scatter of two ranks, without a copy, and the same bytes (two operands combine to
    the same result in either order; with more ranks the order would be ours, not MPI's).
    Otherwise MPI reduces into a scratch block, copied into the output once it is done
    (``MPI_IN_PLACE`` writes the result at the start of the input, not in this rank's block).
    A large input on one node goes by cross-memory first (:func:`_crossed`)."""
    count = output.numel()
    out = output.detach().reshape(-1).numpy()
    combine = _COMBINE.get(red.name)
    own = output.data_ptr() == input.data_ptr() + rank * count * output.element_size()

    def body(comm):
        scratch = SCRATCH.take(out)
        # Another rank's block of the input is that rank's to read: its result waits in scratch.
        if (yield from _crossed(comm, size, whole, out if own else scratch, red)):
            if not own:
                out[...] = scratch
        elif op.everywhere and combine is not None:
            peer = 1 - rank
            yield from _swapped(comm, rank, whole[peer * count : (peer + 1) * count], scratch)
            with _np.errstate(all="ignore"):  # overflow to inf, as MPI's sum: no warning
                combine(out, scratch, out=out)
        else:
            yield [comm.Ireduce_scatter_block(whole, scratch, red.mpi_op)], True
            out[...] = scratch
        SCRATCH.give(scratch)

    op = Op(
        "reduce_scatter_tensor",
        signature,
        describe,
        body,
        output,
        in_place=own and size == 2 and combine is not None,
    )
    return op


def _swapped(comm, rank: int, theirs, into):
    """The step of a two-rank reduce-scatter's exchange: ``theirs`` (the peer's block of this
    rank's input) sent to the peer, the peer's block for this rank received into ``into``."""
    peer = 1 - rank
    received = comm.Irecv(into, peer, REDUCE_SCATTER_TAG)
    yield [received, comm.Isend(theirs, peer, REDUCE_SCATTER_TAG)], True


def _exchanged(rank, output, whole, out, red, signature, describe) -> Op:
    """The plain form at 2 ranks, by the in-place form's exchange (:func:`_into_block`): the
    peer's block of the input sent, this rank's received into the output and combined with its
    own block there. MPICH's nonblocking reduce-scatter of 1 MiB is much slower than its
    blocking form (docs/allreduce.md); both forms post the same messages, so ranks may mix them.
    A large input on one node goes by cross-memory first (:func:`_crossed`)."""
    count = out.size
    mine, theirs = whole[rank * count : (rank + 1) * count], whole[(1 - rank) * count :][:count]
    combine = _COMBINE[red.name]

    def body(comm):
        if (yield from _crossed(comm, 2, whole, out, red)):
            return
        if op.everywhere:
            yield from _swapped(comm, rank, theirs, out)
            with _np.errstate(all="ignore"):  # overflow to inf, as MPI's sum: no warning
                combine(out, mine, out=out)
        else:
            yield [comm.Ireduce_scatter_block(whole, out, red.mpi_op)], True

    op = Op("reduce_scatter_tensor", signature, describe, body, output, in_place=True)
    return op


# The operations of in_place_array's dtypes and reductions, as numpy applies them element by
# element (integers wrap, as in MPI).
_COMBINE = {
    "sum": _np.add,
    "prod": _np.multiply,
    "min": _np.minimum,
    "max": _np.maximum,
    "band": _np.bitwise_and,
    "bor": _np.bitwise_or,
    "bxor": _np.bitwise_xor,
}


def _is_block(output: torch.Tensor, input: torch.Tensor) -> bool:
    """Whether ``output`` is exactly one of ``input``'s blocks of ``output.numel()`` elements."""
    nbytes = output.numel() * output.element_size()
    offset = output.data_ptr() - input.data_ptr()
    return (
        nbytes > 0 and offset % nbytes == 0 and 0 <= offset < input.numel() * input.element_size()
    )


@refusing("reduce_scatter")
def reduce_scatter(rank: int, size: int, output: torch.Tensor, pieces, opts) -> Op:
    """``pieces[r]`` reduced over the ranks lands in rank ``r``'s ``output``; the pieces may
    differ in size (``Ireduce_scatter`` with counts), the same on every rank."""
    pieces = list(pieces)
    red, problem, name = _prepare([output, *pieces], opts)

    def describe() -> str:
        return f"output {shape_text([output])}, pieces {shape_text(pieces)}, op {name}"

    signature = _signature(pieces, red, dtype_code(output.dtype))
    if problem is None:
        problem = _pieces_problem(rank, size, output, pieces)
    if problem is not None:
        return Op("reduce_scatter", signature, describe, None, output, problem)
    counts = [p.numel() for p in pieces]
    flat = joined(pieces)  # the chunks of one tensor: no copy
    shared = overlapping([*pieces, output])  # then the pieces are read from copies
    buffers = [ReduceBuffer(t, red, stage=shared) for t in ([flat] if flat is not None else pieces)]
    result = ReduceBuffer(output, red, size)
    equal = len(set(counts)) == 1
    # Equal pieces, on a group of one node: by cross-memory where the policy says so
    # (:func:`_crossed`), read where they lie.

    def body(comm):
        arrays = [b.start() for b in buffers]
        out = result.start()
        if not (equal and (yield from _crossed(comm, size, arrays, out, red))):
            whole = arrays[0] if len(arrays) == 1 else _np.concatenate(arrays)
            if equal:
                yield [comm.Ireduce_scatter_block(whole, out, red.mpi_op)], True
            else:
                yield [comm.Ireduce_scatter(whole, out, counts, red.mpi_op)], True
        for b in buffers:
            b.finish(write=False)
        result.finish()

    return Op("reduce_scatter", signature, describe, body, output)


def _pieces_problem(rank: int, size: int, output: torch.Tensor, pieces: list) -> str | None:
    if len(pieces) != size:
        return f"{len(pieces)} input pieces, expected {size} (one per rank)"
    if any(p.dtype != output.dtype for p in pieces):
        return f"pieces of {sorted({str(p.dtype) for p in pieces})} for a {output.dtype} output"
    if pieces[rank].numel() != output.numel():
        return f"this rank's piece has {pieces[rank].numel()} elements, its output {output.numel()}"
    return None


@refusing("sparse_all_reduce", sparse=True)
def sparse_all_reduce(size: int, tensors, opts) -> Op:
    """A sparse COO tensor summed over the ranks, as gloo does it: every rank's indices and values
    gathered, then coalesced (three collectives: counts, indices, values)."""
    from torch.distributed import ReduceOp

    tensor = tensors[0]

    def describe() -> str:
        return f"sparse {shape_text([tensor])}, sparse dims {tensor.sparse_dim()}"

    signature = [dtype_code(tensor.dtype), fold(tensor.shape), tensor.sparse_dim() + 1000]
    problem = None
    if len(tensors) != 1 or _op_of(opts) != ReduceOp.SUM or not tensor.is_cpu:
        problem = "mpisync reduces one sparse CPU tensor at a time, with SUM only"
    if problem is not None:
        return Op("sparse_all_reduce", signature, describe, None, tensors, problem)
    local = tensor.coalesce()
    indices = local.indices().t().contiguous()  # (nnz, sparse dims): rows gather end to end
    values = local.values().contiguous()

    def body(comm):
        counts = _np.empty(size, dtype=_np.int64)
        yield [comm.Iallgather(_np.array([values.shape[0]], dtype=_np.int64), counts)], False
        total = int(counts.sum())
        all_indices = torch.empty((total, indices.shape[1]), dtype=indices.dtype)
        all_values = torch.empty((total, *values.shape[1:]), dtype=values.dtype)
        gathers = [_gatherv(comm, indices, all_indices, counts)]
        yield gathers + [_gatherv(comm, values, all_values, counts)], True
        summed = torch.sparse_coo_tensor(all_indices.t(), all_values, tensor.shape).coalesce()
        with torch.no_grad():
            tensor.copy_(summed)

    return Op("sparse_all_reduce", signature, describe, body, tensors)


def _gatherv(comm, mine: torch.Tensor, everything: torch.Tensor, rows):
    """``Iallgatherv`` of every rank's rows of ``mine`` into ``everything`` (as bytes)."""
    row_bytes = int(_np.prod(mine.shape[1:], dtype=_np.int64)) * mine.element_size()
    counts = [int(r) * row_bytes for r in rows]
    displs = _np.concatenate([[0], _np.cumsum(counts)[:-1]]).astype(_np.int64).tolist()
    send = mine.reshape(-1).view(torch.uint8).numpy()
    recv = everything.reshape(-1).view(torch.uint8).numpy()
    return comm.Iallgatherv(send, [recv, (counts, displs), MPI.BYTE])
