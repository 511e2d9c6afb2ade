"""Which mechanism carries a collective between the ranks of one node: the one table every front
end asks (``ParamSync``'s :mod:`~mpisync.transports.selection`, ``GradSync``'s
:mod:`mpisync.allreduce.transport`, the torch backend, ``mpisync.horovod``).

:func:`choose` maps (operation, bytes, ranks, memory layout, whether the node's mechanism may
take the call) to a mechanism name: :data:`MPI` (the MPI library's own collective),
:data:`CROSS` (cross-memory copies, :mod:`~mpisync.transports.crossreduce` and its kin) or
:data:`PAIRWISE` (point-to-point messages, :mod:`~mpisync.transports.pairwise`). Every size that
chooses a path is defined here and nowhere else, each with the bench command that measures it
(run it under ``mpiexec`` at the ranks asked about; docs/performance.md holds the figures).

Every input is one every rank holds alike (sizes and counts the argument check or the agreed
manifest compares, the communicator's size), so every rank gets the same answer and posts the
same collectives. Cross-memory, where chosen, still probes its peers on its first call and
answers False on every rank where it cannot run (``MPISYNC_CROSS_MEMORY=0``, a kernel that
refuses): the caller then takes :data:`MPI`.
"""

from __future__ import annotations

__all__ = [
    "MPI",
    "CROSS",
    "PAIRWISE",
    "OPERATIONS",
    "BROADCAST",
    "ALLREDUCE",
    "REDUCE",
    "ALLGATHER",
    "REDUCE_SCATTER",
    "ALLTOALL",
    "ARRAY",
    "LIST",
    "CROSS_REDUCE_MIN_BYTES",
    "CROSS_BROADCAST_MIN_BYTES",
    "PAIRWISE_MAX_RANKS",
    "choose",
    "parameter_set",
]

MPI = "mpi"
CROSS = "cross-memory"
PAIRWISE = "pairwise"

BROADCAST, ALLREDUCE, REDUCE = "broadcast", "allreduce", "reduce"
ALLGATHER, REDUCE_SCATTER, ALLTOALL = "allgather", "reduce_scatter", "alltoall"
OPERATIONS = (BROADCAST, ALLREDUCE, REDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL)

#: One contiguous array.
ARRAY = "array"
#: Several arrays (of one dtype for the reductions, read where they lie, as if end to end).
LIST = "list"
_LAYOUTS = (ARRAY, LIST)

# The smallest all-reduce, reduce, reduce-scatter and all-gather (bytes gathered) by
# cross-memory; below it the pinning of a peer's pages costs more than MPI's own copies.
# Measured by: mpiexec -n 2 mpisync bench --allreduce --rows collectives
#   --sizes 4194304 8388608 16777216 33554432 --max-bytes 33554432
CROSS_REDUCE_MIN_BYTES = 16 << 20
# The smallest broadcast of one array by cross-memory.
# Measured by: mpiexec -n 2 mpisync bench --allreduce --rows collectives
#   --sizes 2097152 4194304 8388608 16777216 --max-bytes 16777216
CROSS_BROADCAST_MIN_BYTES = 8 << 20
# The most ranks an all-to-all of pieces sized by pair posts point-to-point messages for (a
# node's worth); beyond, one Ialltoallv. Measured by: mpiexec -n 4 mpisync bench --allreduce
#   --rows collectives (the all_to_all rows)
PAIRWISE_MAX_RANKS = 16


def choose(operation: str, nbytes: int, ranks: int, layout: str = ARRAY, node: bool = True) -> str:
    """The mechanism for one collective: ``operation`` (one of :data:`OPERATIONS`) of ``nbytes``
    (this rank's input; for an all-gather the bytes gathered, for a reduce-scatter the whole
    input) over ``ranks`` ranks, its memory ``layout`` (:data:`ARRAY` or :data:`LIST`);
    ``node``: whether the node's mechanism may take this call at all (the ranks on one node as
    far as the caller knows, an operation and dtype it combines). Returns :data:`MPI`,
    :data:`CROSS` or :data:`PAIRWISE`."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}, expected one of {OPERATIONS}")
    if layout not in _LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}, expected one of {_LAYOUTS}")
    if operation == ALLTOALL:  # pieces sized by pair (a list); an equal split is MPI's Ialltoall
        return PAIRWISE if layout == LIST and 1 < ranks <= PAIRWISE_MAX_RANKS else MPI
    if ranks < 2 or not node:
        return MPI
    if operation == BROADCAST:
        return CROSS if layout == ARRAY and nbytes >= CROSS_BROADCAST_MIN_BYTES else MPI
    if operation == ALLGATHER:
        return CROSS if layout == ARRAY and nbytes >= CROSS_REDUCE_MIN_BYTES else MPI
    return CROSS if nbytes >= CROSS_REDUCE_MIN_BYTES else MPI


def parameter_set(small: bool, cross: bool) -> tuple[str, str]:
    """``(mechanism, why)`` for one ``ParamSync`` broadcast of a parameter set whose ranks are all
    on one node: ``small`` (every tensor smaller than ``fusion_bytes``: fused buckets, which MPI
    moves), ``cross`` (whether cross-memory copies can run on every rank)."""
    if not small and cross:
        return CROSS, "every rank on one node, cross-memory copies permitted, large tensors"
    return MPI, "no single-copy transport applies"
