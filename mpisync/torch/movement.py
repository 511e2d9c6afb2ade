"""The operations that move bytes without reducing them, as :class:`~mpisync.torch.op.Op`:
broadcast, all_gather (+into_tensor, +coalesced), gather, scatter, all_to_all (+single, equal or
split sizes), barrier. Any dtype: they move bytes."""

from __future__ import annotations

import math as _math
from collections.abc import Callable

import numpy as _np
import torch
from mpi4py import MPI

from ..transports import node, pairwise
from ..transports import policy as _policy
from .buffers import SCRATCH
from .errors import MismatchError
from .op import Op, dtype_code, flat_bytes, fold, host_bytes, joined, overlapping, shape_text
from .refusals import refusing

__all__ = [
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "scatter",
]


# The tags of the messages the collectives built of point-to-point messages send on the group's
# communicator (no user message travels there: send and recv use the group's other one).
_SCATTER_TAG, _GATHER_TAG, _ALL_TO_ALL_TAG, REDUCE_SCATTER_TAG = 1, 2, 3, 4


def _signature(tensors, *extra) -> list:
    return [fold(dtype_code(t.dtype) for t in tensors), fold(t.numel() for t in tensors), *extra]


def _copied(array: _np.ndarray) -> _np.ndarray:
    """``array``'s bytes in a scratch buffer (hand it back to ``SCRATCH`` once MPI is done)."""
    copy = SCRATCH.take(array)
    copy[...] = array
    return copy


def _root_problem(root: int, size: int) -> str | None:
    return None if 0 <= root < size else f"root {root} is not a rank of this group of {size}"


def _copy_out(flat: _np.ndarray, outputs) -> None:
    """Slice the received bytes ``flat`` into ``outputs``, in order."""
    offset = 0
    with torch.no_grad():
        for out in outputs:
            n = out.numel() * out.element_size()
            if n:
                out.copy_(
                    torch.from_numpy(flat[offset : offset + n]).view(out.dtype).reshape(out.shape)
                )
            offset += n


def _like_problem(what: str, outputs, reference: torch.Tensor, count: int) -> str | None:
    if len(outputs) != count:
        return f"{what} holds {len(outputs)} tensors, expected {count} (one per rank)"
    for index, out in enumerate(outputs):
        if out.numel() != reference.numel() or out.dtype != reference.dtype:
            return (
                f"{what}[{index}] is {shape_text([out])}, expected {reference.numel()} elements "
                f"of {reference.dtype} (as {shape_text([reference])})"
            )
    return None


def _gather_lists(output_lists, inputs) -> tuple[list, list[list], Callable[[], str]]:
    """An all-gather's ``inputs`` and ``output_lists`` as lists (of lists), and its describe."""
    inputs = list(inputs)

    def describe() -> str:
        return f"inputs {shape_text(inputs)}"

    return inputs, [list(o) for o in output_lists], describe


def barrier() -> Op:
    """Complete once every rank reached it (after everything issued before it)."""

    def body(comm):
        yield [comm.Ibarrier()], True

    return Op("barrier", [0, 0], lambda: "no tensors", body, [])


@refusing("broadcast")
def broadcast(size: int, tensors, opts) -> Op:
    """``opts.rootRank``'s ``tensors`` into every rank's (one ``Ibcast`` each; one large tensor on
    one node by the node's mechanism, :func:`mpisync.transports.node.broadcast_steps`)."""
    tensors, root = list(tensors), opts.rootRank

    def describe() -> str:
        return f"{shape_text(tensors)}, root {root}"

    problem = _root_problem(root, size)
    if problem is not None:
        return Op("broadcast", _signature(tensors, root), describe, None, tensors, problem)
    views = [host_bytes(t) for t in tensors]

    def body(comm):
        # the node's mechanism or MPI's, by what the argument check compares: alike everywhere
        yield from node.broadcast_steps(comm, [view for view, _ in views], root)
        for _, back in views:
            if back is not None:
                back()

    return Op("broadcast", _signature(tensors, root), describe, body, tensors)


@refusing("all_gather")
def all_gather(size: int, output_lists, inputs) -> Op:
    """Every rank's ``inputs[i]`` into ``output_lists[i][rank]``."""
    inputs, output_lists, describe = _gather_lists(output_lists, inputs)
    problem = None
    if len(output_lists) != len(inputs):
        problem = f"{len(output_lists)} output lists for {len(inputs)} inputs"
    for index, (outputs, tensor) in enumerate(zip(output_lists, inputs)):
        problem = problem or _like_problem(f"output list {index}", outputs, tensor, size)
    if problem is not None:
        return Op("all_gather", _signature(inputs), describe, None, output_lists, problem)
    sends = [host_bytes(t.contiguous())[0] for t in inputs]
    # outputs end to end in one tensor (its chunks) are received into in place
    direct = [joined(outputs) for outputs in output_lists]
    if any(d is not None for d in direct) and overlapping(
        [*inputs, *(d for d in direct if d is not None)]
    ):
        sends = [s.copy() for s in sends]  # an input among the outputs: MPI reads a copy
    recvs = [
        flat_bytes(d) if d is not None else _np.empty(s.nbytes * size, _np.uint8)
        for d, s in zip(direct, sends)
    ]
    # One input: by the node's mechanism where the policy gives one (it depends only on what the
    # argument check compares, so it is the same on every rank).
    single = len(inputs) == 1

    def body(comm):
        if single and (yield from _gathered_across(comm, inputs[0], sends[0], output_lists[0])):
            return
        yield [comm.Iallgather(s, r) for s, r in zip(sends, recvs)], True
        for recv, outputs, d in zip(recvs, output_lists, direct):
            if d is None:
                _copy_out(recv, outputs)

    return Op("all_gather", _signature(inputs), describe, body, output_lists)


def _gathered_across(comm, input: torch.Tensor, send: _np.ndarray, outputs: list):
    """The all-gather of ``send`` (``input``'s bytes) into ``outputs`` by the node's mechanism
    (:func:`mpisync.transports.node.allgather_steps`); returns whether it ran (the same on every
    rank). Each peer's bytes land straight in this rank's output for it where the outputs are
    contiguous CPU tensors that share no memory with each other or with the input
    (``outputs[rank]`` may be the input itself); else in one buffer, sliced into the outputs
    afterwards, in rank order."""
    rank, n = comm.rank, send.nbytes
    others = [o for r, o in enumerate(outputs) if r != rank]
    direct = (
        all(o.is_cpu and o.is_contiguous() for o in outputs)
        and not overlapping(outputs)
        and not overlapping([input, *others])
    )
    flat: list = []  # the one buffer, where the outputs cannot take the bytes

    def blocks() -> list:
        if direct:
            return [flat_bytes(o) for o in outputs]
        flat.append(_np.empty(n * len(outputs), _np.uint8))
        return [flat[0][r * n : (r + 1) * n] for r in range(len(outputs))]

    done = yield from node.allgather_steps(comm, send, blocks)
    if done and flat:
        _copy_out(flat[0], outputs)
    return done


@refusing("all_gather_into_tensor")
def all_gather_into_tensor(rank: int, size: int, output: torch.Tensor, input: torch.Tensor) -> Op:
    """Every rank's ``input`` end to end in ``output``."""

    def describe() -> str:
        return f"input {shape_text([input])}, output {shape_text([output])}"

    signature = _signature([input], dtype_code(output.dtype))
    problem = None
    if output.numel() != input.numel() * size or output.dtype != input.dtype:
        problem = (
            f"output is {shape_text([output])}, expected {input.numel() * size} elements of "
            f"{input.dtype} ({size} x the input's {input.numel()})"
        )
    if problem is not None:
        return Op("all_gather_into_tensor", signature, describe, None, output, problem)
    recv, back = host_bytes(output)
    send = host_bytes(input.contiguous())[0]
    shared = bool(_np.may_share_memory(send, recv))
    # FSDP's form: the input is this rank's block of the output
    mine = shared and send.ctypes.data == recv.ctypes.data + send.nbytes * rank

    def body(comm):
        source: object
        copy = None
        if op.everywhere:  # every rank's input is its block: MPI_IN_PLACE
            source = MPI.IN_PLACE
        elif shared:  # from a copy (MPI refuses aliased buffers), in a reused buffer
            source = copy = _copied(send)
        else:
            source = send
        yield [comm.Iallgather(source, recv)], True
        if copy is not None:
            SCRATCH.give(copy)
        if back is not None:
            back()

    op = Op(
        "all_gather_into_tensor",
        signature,
        describe,
        body,
        output,
        in_place=mine,
    )
    return op


@refusing("all_gather_coalesced")
def all_gather_coalesced(size: int, output_lists, inputs) -> Op:
    """Every rank's ``inputs[i]`` into ``output_lists[rank][i]`` (torch's layout)."""
    inputs, output_lists, describe = _gather_lists(output_lists, inputs)
    problem = None
    if len(output_lists) != size:
        problem = f"{len(output_lists)} output lists, expected {size} (one per rank)"
    for r, outputs in enumerate(output_lists):
        if len(outputs) != len(inputs):
            problem = problem or f"output list {r} holds {len(outputs)} tensors for {len(inputs)}"
    for i, tensor in enumerate(inputs):
        column = [outputs[i] for outputs in output_lists if len(outputs) == len(inputs)]
        problem = problem or _like_problem(f"outputs of input {i}", column, tensor, size)
    if problem is not None:
        return Op("all_gather_coalesced", _signature(inputs), describe, None, output_lists, problem)
    sends = [host_bytes(t.contiguous())[0] for t in inputs]
    recvs = [_np.empty(s.nbytes * size, _np.uint8) for s in sends]

    def body(comm):
        yield [comm.Iallgather(s, r) for s, r in zip(sends, recvs)], True
        for i, recv in enumerate(recvs):
            _copy_out(recv, [outputs[i] for outputs in output_lists])

    return Op("all_gather_coalesced", _signature(inputs), describe, body, output_lists)


def _rooted_problem(kind: str, rank: int, size: int, root: int, mine: list, lists: list):
    """Why a gather's or scatter's arguments are refused, or None: ``mine``, the one tensor this
    rank gives (gather) or takes (scatter); ``lists``, the list only the root holds."""
    word = "input" if kind == "gather" else "output"
    problem = _root_problem(root, size)
    if problem is None and len(mine) != 1:
        problem = f"{len(mine)} {word} tensors, expected 1"
    if problem is None and rank == root:
        problem = f"no {kind} list on the root" if len(lists) != 1 else None
        problem = problem or _like_problem(f"the {kind} list", lists[0], mine[0], size)
    if problem is None and rank != root and any(lists):
        problem = f"a {kind} list on a rank that is not the root"
    return problem


def _rooted(kind: str, rank: int, size: int, mine, lists, opts) -> tuple:
    """``(root, mine, lists, describe, refused)`` of a gather or a scatter: ``mine``, the one
    tensor this rank gives (gather) or takes (scatter), and ``lists``, the root's list, as lists;
    ``refused``, the operation refused on every rank, or None."""
    root, mine, lists = opts.rootRank, list(mine), [list(x) for x in lists]
    word = "input" if kind == "gather" else "output"

    def describe() -> str:
        return f"{word} {shape_text(mine)}, root {root}"

    problem = _rooted_problem(kind, rank, size, root, mine, lists)
    if problem is None:
        return root, mine, lists, describe, None
    result = lists if kind == "gather" else mine
    return (
        root,
        mine,
        lists,
        describe,
        Op(kind, _signature(mine, root), describe, None, result, problem),
    )


@refusing("gather")
def gather(rank: int, size: int, outputs, inputs, opts) -> Op:
    """Every rank's ``inputs[0]`` into ``outputs[0][rank]`` on ``opts.rootRank``."""
    root, inputs, lists, describe, refused = _rooted("gather", rank, size, inputs, outputs, opts)
    if refused is not None:
        return refused
    send = host_bytes(inputs[0].contiguous())[0]
    targets = [host_bytes(t) for t in lists[0]] if rank == root else []

    def body(comm):
        # Point to point into each output's own memory (as scatter): Igather receives into one
        # buffer, copied out afterwards.
        if rank == root:
            yield (
                [comm.Irecv(v, r, _GATHER_TAG) for r, (v, _) in enumerate(targets) if r != root],
                True,
            )
            targets[root][0][...] = send
        else:
            yield [comm.Isend(send, root, _GATHER_TAG)], True
        for _, back in targets:
            if back is not None:
                back()

    return Op("gather", _signature(inputs, root), describe, body, lists)


@refusing("scatter")
def scatter(rank: int, size: int, outputs, inputs, opts) -> Op:
    """``inputs[0][r]`` on ``opts.rootRank`` into rank ``r``'s ``outputs[0]``."""
    root, outputs, lists, describe, refused = _rooted("scatter", rank, size, outputs, inputs, opts)
    if refused is not None:
        return refused
    recv, back = host_bytes(outputs[0])
    pieces = [host_bytes(t.contiguous())[0] for t in lists[0]] if rank == root else []

    def body(comm):
        # Point to point from the root, each piece from its own memory: MPI's Iscatter needs
        # them in one buffer, and that copy cost more than the scatter (docs/allreduce.md).
        if rank == root:
            yield [comm.Isend(p, r, _SCATTER_TAG) for r, p in enumerate(pieces) if r != root], True
            recv[...] = pieces[root]
        else:
            yield [comm.Irecv(recv, root, _SCATTER_TAG)], True
        if back is not None:
            back()

    return Op("scatter", _signature(outputs, root), describe, body, outputs)


@refusing("all_to_all")
def all_to_all(size: int, outputs, inputs) -> Op:
    """``inputs[j]`` to rank ``j``; ``outputs[j]`` from rank ``j`` (sizes may differ by pair).

    On a group of up to ``policy.PAIRWISE_MAX_RANKS`` ranks, one message each way per peer straight
    between the tensors (:func:`_peer_to_peer`); on a larger one, MPI's ``Ialltoallv`` through
    reused buffers (:func:`_through_mpi`), one request where the engine would otherwise follow
    two per peer."""
    outputs, inputs = list(outputs), list(inputs)

    def describe() -> str:
        return f"inputs {shape_text(inputs)}, outputs {shape_text(outputs)}"

    dtypes = {t.dtype for t in outputs + inputs}
    signature = [fold(dtype_code(t) for t in sorted(dtypes, key=str)), size]
    problem = None
    if len(outputs) != size or len(inputs) != size:
        problem = f"{len(inputs)} inputs and {len(outputs)} outputs, expected {size} of each"
    elif len(dtypes) > 1:
        problem = f"mixed dtypes {sorted(str(d) for d in dtypes)}"
    cross = ([t.numel() for t in inputs], [t.numel() for t in outputs])
    if problem is not None:
        return Op("all_to_all", signature, describe, None, outputs, problem, cross=cross)
    direct = _policy.choose(_policy.ALLTOALL, 0, size, _policy.LIST) == _policy.PAIRWISE
    body = _peer_to_peer(outputs, inputs) if direct else _through_mpi(outputs, inputs)
    return Op("all_to_all", signature, describe, body, outputs, cross=cross)


def _peer_to_peer(outputs: list, inputs: list):
    """The body of an all-to-all by one receive and one send per peer, straight between the
    tensors: no copy of the inputs joined into a buffer, no receive buffer copied out
    (docs/allreduce.md, "``all_to_all`` of tensor lists"). Every rank posts the same messages
    whatever its tensors' layout: an output that is not a contiguous CPU tensor is received into
    a copy written back, and outputs that share memory with each other or with an input are
    received into copies written in rank order once every message is in."""
    sends = [host_bytes(t)[0] for t in inputs]
    counts = [t.numel() * t.element_size() for t in outputs]
    # outputs that share memory with each other or with an input (one input sent to every peer
    # is not that): every one received into one buffer, written once nothing is read any more
    distinct = list({id(t): t for t in inputs}.values())
    staged = _np.empty(sum(counts), _np.uint8) if overlapping(outputs + distinct) else None
    if staged is not None:
        receives, backs = pairwise.pieces(staged, counts), []
    else:
        held = [host_bytes(t) for t in outputs]
        receives, backs = [r for r, _ in held], [b for _, b in held if b is not None]

    def body(comm):
        yield pairwise.post(comm, _ALL_TO_ALL_TAG, receives, sends), True
        if staged is not None:
            _copy_out(staged, outputs)
        for back in backs:
            back()

    return body


def _through_mpi(outputs: list, inputs: list):
    """The body of an all-to-all by one ``Ialltoallv``: the inputs read in place where they are
    the chunks of one CPU tensor, else packed into a reused buffer; the outputs likewise written
    in place, else received into a reused buffer and copied out."""
    send_counts = [t.numel() * t.element_size() for t in inputs]
    recv_counts = [t.numel() * t.element_size() for t in outputs]
    whole_in, whole_out = joined(inputs), joined(outputs)
    if whole_out is not None and overlapping([whole_out, *inputs]):
        whole_out = None  # MPI refuses aliased buffers: received into a copy

    def body(comm):
        send = flat_bytes(whole_in) if whole_in is not None else _packed(inputs, sum(send_counts))
        recv = flat_bytes(whole_out) if whole_out is not None else _scratch(sum(recv_counts))
        yield [comm.Ialltoallv(_counted(send, send_counts), _counted(recv, recv_counts))], True
        if whole_out is None:
            _copy_out(recv, outputs)
            SCRATCH.give(recv)
        if whole_in is None:
            SCRATCH.give(send)

    return body


def _scratch(nbytes: int) -> _np.ndarray:
    """A reused byte buffer of ``nbytes`` (hand it back to ``SCRATCH`` once MPI is done)."""
    return SCRATCH.take(_np.broadcast_to(_np.uint8(0), (nbytes,)))  # a shape, no memory


def _packed(tensors: list, nbytes: int) -> _np.ndarray:
    """``tensors``' bytes end to end in a reused buffer (hand it back to ``SCRATCH``)."""
    buffer, offset = _scratch(nbytes), 0
    for tensor in tensors:
        flat = host_bytes(tensor)[0]
        buffer[offset : offset + flat.nbytes] = flat
        offset += flat.nbytes
    return buffer


def _counted(buffer: _np.ndarray, counts: list) -> list:
    displs = [0] * len(counts)
    for i in range(1, len(counts)):
        displs[i] = displs[i - 1] + counts[i - 1]
    return [buffer, (counts, displs), MPI.BYTE]


@refusing("all_to_all_single")
def all_to_all_single(rank: int, size: int, output, input, out_splits, in_splits) -> Op:
    """Rows of ``input`` to each rank and of ``output`` from each (dimension 0): equal blocks, or
    the split sizes given (missing ones: equal). Equal blocks go by MPI's ``Ialltoall``; split
    sizes, on a group of up to ``policy.PAIRWISE_MAX_RANKS`` ranks, by one message each way per
    peer between the tensors' pieces (:mod:`mpisync.transports.pairwise`), else by one
    ``Ialltoallv``."""
    out_splits, in_splits = list(out_splits or ()), list(in_splits or ())
    row, out_row = _row(input), _row(output)

    def describe() -> str:
        return (
            f"input {shape_text([input])} split {in_splits or 'equally'}, output "
            f"{shape_text([output])} split {out_splits or 'equally'}"
        )

    equal = not out_splits and not in_splits
    signature = [dtype_code(input.dtype), input.numel() if equal else row, int(equal)]
    problem = _splits_problem(size, output, input, out_splits, in_splits, row, out_row)
    rows_in = in_splits or _equal_rows(input, size)
    rows_out = out_splits or _equal_rows(output, size)
    cross = None if equal else ([r * row for r in rows_in], [r * out_row for r in rows_out])
    if problem is not None:
        return Op("all_to_all_single", signature, describe, None, output, problem, cross=cross)
    recv, back = host_bytes(output)
    send = host_bytes(input.contiguous())[0]
    shared = bool(_np.may_share_memory(send, recv))
    # the same tensor in and out with equal splits (torch allows it)
    same = shared and equal and send.ctypes.data == recv.ctypes.data
    item = input.element_size()
    send_counts = [r * row * item for r in rows_in]
    recv_counts = [r * out_row * item for r in rows_out]
    pieces = _policy.choose(_policy.ALLTOALL, 0, size, _policy.LIST) == _policy.PAIRWISE
    direct = not equal and pieces

    def body(comm):
        if op.everywhere:  # every rank passed one tensor
            yield from _exchanged_in_place(comm, recv)
            return
        source: _np.ndarray
        copy = None
        if shared:  # from a copy (MPI refuses aliased buffers), in a reused buffer
            source = copy = _copied(send)
        else:
            source = send
        if equal:
            yield [comm.Ialltoall(source, recv)], True
        elif direct:
            if send_counts[rank] != recv_counts[rank]:  # only with the check off
                raise MismatchError(
                    f"mpisync: all_to_all_single: rank {rank} sends itself "
                    f"{send_counts[rank]} bytes and expects {recv_counts[rank]}"
                )
            receives = pairwise.pieces(recv, recv_counts)
            sends = pairwise.pieces(source, send_counts)
            yield pairwise.post(comm, _ALL_TO_ALL_TAG, receives, sends), True
        else:
            counted = _counted(source, send_counts)
            yield [comm.Ialltoallv(counted, _counted(recv, recv_counts))], True
        if copy is not None:
            SCRATCH.give(copy)
        if back is not None:
            back()

    in_place = same and size > 1
    op = Op("all_to_all_single", signature, describe, body, output, cross=cross, in_place=in_place)
    return op


def _exchanged_in_place(comm, blocks: _np.ndarray):
    """The steps of an equal-split all-to-all with one buffer in and out on every rank: block
    ``p`` of ``blocks`` goes to rank ``p`` from a copy, and rank ``p``'s block for this rank is
    received in its place, every peer at once (MPICH's ``MPI_IN_PLACE`` all-to-all exchanges
    with one peer at a time; docs/allreduce.md compares them)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    n = blocks.nbytes // size
    stage = SCRATCH.take(blocks[: n * (size - 1)])
    requests = []
    for step in range(1, size):
        peer = (rank + step) % size
        out, block = stage[(step - 1) * n : step * n], blocks[peer * n : (peer + 1) * n]
        out[...] = block  # before the peer's block may land there
        requests.append(comm.Irecv(block, peer, _ALL_TO_ALL_TAG))
        requests.append(comm.Isend(out, peer, _ALL_TO_ALL_TAG))
    yield requests, True
    SCRATCH.give(stage)


def _row(tensor: torch.Tensor) -> int:
    """Elements per row (dimension 0) of ``tensor``, from its shape: a tensor of no rows (a
    mixture-of-experts rank that routes no tokens) has rows of the same length as any other."""
    return _math.prod(tensor.shape[1:]) if tensor.dim() else 1


def _equal_rows(tensor: torch.Tensor, size: int) -> list:
    rows = tensor.shape[0] if tensor.dim() else 1
    return [rows // size] * size


def _splits_problem(size, output, input, out_splits, in_splits, row, out_row) -> str | None:
    if output.dtype != input.dtype:
        return f"input is {input.dtype}, output {output.dtype}"
    if not out_splits and not in_splits:
        if input.numel() % size or output.numel() != input.numel():
            return (
                f"equal splits need an input divisible by {size} ranks and an output as large: "
                f"input {shape_text([input])}, output {shape_text([output])}"
            )
        return None
    if row != out_row:
        return f"input rows of {row} elements, output rows of {out_row}"
    for name, splits, tensor in (("input", in_splits, input), ("output", out_splits, output)):
        if splits and (len(splits) != size or sum(splits) != tensor.shape[0] or min(splits) < 0):
            return f"{name} split sizes {splits} for {size} ranks and {tensor.shape[0]} rows"
    return None
