"""Point-to-point operations as :class:`~mpisync.torch.op.Op`: send, recv (from a rank or any
source), with tags. A receive checks the size of what arrived (``MPI.Status.Get_count``)."""

from __future__ import annotations

from mpi4py import MPI

from .errors import ArgumentError, CountError
from .op import Op, host_bytes, shape_text
from .refusals import resolving, tensor_problem

__all__ = ["recv", "send"]

_tag_bound: list = []  # MPI's largest tag, once asked


def _peer_problem(what: str, peer: int, size: int) -> None:
    if not 0 <= peer < size:
        raise ArgumentError(f"mpisync: {what} rank {peer} is not a rank of this group of {size}")


def _refuse(what: str, tensors, tag: int) -> None:
    """Raise at once what MPI would refuse only once posted: a tag out of MPI's range (a negative
    one is refused by gloo too), a tensor the backend cannot move. Both ends of a message pass
    the same tag, so both refuse it."""
    if not _tag_bound:
        _tag_bound.append(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))
    if not 0 <= tag <= _tag_bound[0]:
        raise ArgumentError(f"mpisync: {what}: tag {tag} is not in [0, {_tag_bound[0]}]")
    problem = tensor_problem(tensors)
    if problem is not None:
        raise ArgumentError(f"mpisync: {what}: {problem}")


def send(rank: int, size: int, tensors, dst: int, tag: int) -> Op:
    """``tensors`` (their values: a negative or conjugate view's resolved, as gloo sends them)
    to ``dst`` with ``tag``."""
    return resolving(_send, rank, size, tensors, dst, tag)


def _send(rank: int, size: int, tensors, dst: int, tag: int) -> Op:
    _peer_problem("destination", dst, size)
    _refuse("send", tensors, tag)
    views = [host_bytes(t.contiguous())[0] for t in tensors]

    def body(comm):
        yield [comm.Isend(view, dst, tag) for view in views], True

    label = f"send to {dst} (tag {tag})"
    return Op("send", [], lambda: shape_text(tensors), body, list(tensors), label=label, p2p=True)


def recv(rank: int, size: int, tensors, src: int | None, tag: int, source: list) -> Op:
    """``tensors`` from ``src`` (``None``: any rank; the sender's rank lands in ``source[0]``)
    with ``tag``. A message of another size than the tensor is a :class:`CountError`."""
    return resolving(_recv, rank, size, tensors, src, tag, source)


def _recv(rank: int, size: int, tensors, src: int | None, tag: int, source: list) -> Op:
    if src is not None:
        _peer_problem("source", src, size)
    _refuse("recv", tensors, tag)
    targets = [host_bytes(t) for t in tensors]
    peer = MPI.ANY_SOURCE if src is None else src
    label = f"recv from {'any rank' if src is None else src} (tag {tag})"

    def body(comm):
        statuses = yield [comm.Irecv(view, peer, tag) for view, _ in targets], True
        for (view, back), status, tensor in zip(targets, statuses, tensors):
            got = status.Get_count(MPI.BYTE)
            if got != view.nbytes:
                raise CountError(
                    f"mpisync: rank {rank}: {label} got {got} bytes for a tensor of "
                    f"{view.nbytes} ({shape_text([tensor])}): the sender's tensor differs in size "
                    "or dtype"
                )
            source[0] = status.Get_source()
            if back is not None:
                back()

    return Op("recv", [], lambda: shape_text(tensors), body, list(tensors), label=label, p2p=True)
