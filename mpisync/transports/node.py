"""The node's collectives: the one entry the front ends call for a collective that a node
mechanism may carry. Each function asks :mod:`~mpisync.transports.policy` which mechanism
takes the call, runs that mechanism's steps, and falls back to MPI's own collective where the
policy says MPI or the mechanism cannot open (the same answer on every rank).

Each function is a generator of steps, ``(requests, last)``, as the mechanisms' are: the torch
backend's engine resumes it as requests complete; a blocking caller runs it with
:func:`~mpisync.transports.crossreduce.drive`.
"""

from __future__ import annotations

import typing as _typing

from mpi4py import MPI

from . import crossbcast, crossgather, crossreduce, policy
from .crossreduce import Step, combine_of, drive

__all__ = [
    "reduce_steps",
    "reduce_scatter_steps",
    "broadcast_steps",
    "allgather_steps",
    "drive",
]


def reduce_steps(
    comm, arrays: list, mpi_op, root: int | None = None
) -> _typing.Generator[Step, None, None]:
    """Reduce each of ``arrays`` in place over ``comm`` with ``mpi_op`` (``root``: a reduce to
    that rank). One array on a group the node's mechanisms serve goes by the mechanism the
    policy gives its size (a reduce by cross-memory leaves the other ranks their own share of
    the result only); otherwise one ``MPI_Iallreduce`` per array. Sizes, dtypes and ``mpi_op``
    must be the same on every rank (the caller's argument check or agreement)."""
    combine = combine_of(mpi_op) if comm.size > 1 and len(arrays) == 1 else None
    if combine is not None:
        operation = policy.ALLREDUCE if root is None else policy.REDUCE
        if policy.choose(operation, arrays[0].nbytes, comm.size) == policy.CROSS:
            if (yield from crossreduce.reduce_steps(comm, arrays[0], combine, root=root)):
                return
    yield [comm.Iallreduce(MPI.IN_PLACE, a, mpi_op) for a in arrays], True


def reduce_scatter_steps(
    comm, whole, out, mpi_op, equal: bool = True
) -> _typing.Generator[Step, None, bool]:
    """The reduce-scatter of ``whole`` (an array, or equal pieces laid end to end in a list) into
    ``out`` (this rank's block) with ``mpi_op`` by the node's mechanism where the policy gives
    one (``equal``: whether every rank's block is as large); returns whether it ran. Where it
    returns False it has posted nothing: the caller posts MPI's reduce-scatter in the form its
    buffers take."""
    combine = combine_of(mpi_op)
    nbytes = sum(a.nbytes for a in whole) if isinstance(whole, list) else whole.nbytes
    layout = policy.LIST if isinstance(whole, list) else policy.ARRAY
    node = equal and combine is not None
    if policy.choose(policy.REDUCE_SCATTER, nbytes, comm.size, layout, node) != policy.CROSS:
        return False
    return (yield from crossreduce.reduce_steps(comm, whole, combine, out=out))


def broadcast_steps(comm, arrays: list, root: int) -> _typing.Generator[Step, None, None]:
    """``root``'s ``arrays`` (contiguous byte views) into every rank's: one large array on a group
    the policy sends by cross-memory goes that way; otherwise one ``MPI_Ibcast`` per array."""
    layout = policy.ARRAY if len(arrays) == 1 else policy.LIST
    nbytes = sum(a.nbytes for a in arrays)
    if policy.choose(policy.BROADCAST, nbytes, comm.size, layout) == policy.CROSS:
        if (yield from crossbcast.bcast_steps(comm, arrays[0], root)):
            return
    yield [comm.Ibcast(a, root) for a in arrays], True


def allgather_steps(
    comm, send, blocks: _typing.Callable[[], list]
) -> _typing.Generator[Step, None, bool]:
    """Every rank's ``send`` (a contiguous array, as many bytes on every rank) into this rank's
    blocks, one per rank (``blocks()`` makes them, only where a node mechanism runs) by the
    node's mechanism where the policy gives one for the bytes gathered; returns whether it ran.
    Where it returns False it has posted nothing: the caller posts MPI's all-gather in the form
    its buffers take."""
    gathered = send.nbytes * comm.size
    if policy.choose(policy.ALLGATHER, gathered, comm.size, policy.ARRAY) != policy.CROSS:
        return False
    return (yield from crossgather.gather_steps(comm, send, blocks()))
