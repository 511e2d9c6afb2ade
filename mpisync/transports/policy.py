"""Which mechanism carries a collective between the ranks of one node: the one table every front
end asks (``ParamSync``'s :mod:`~mpisync.transports.selection`, ``GradSync``'s
:mod:`mpisync.allreduce.transport`, the torch backend, ``mpisync.horovod``).

:func:`choose` maps (operation, bytes, ranks, memory layout, whether the node's mechanisms may
take the call) to a mechanism name: :data:`MPI` (the MPI library's own collective),
:data:`CROSS` (cross-memory copies, :mod:`~mpisync.transports.crossreduce` and its kin),
:data:`SHARED` (the node's shared segment) or :data:`PAIRWISE` (point-to-point messages,
:mod:`~mpisync.transports.pairwise`). Every size that chooses a path is defined here and nowhere
else, each with the bench command that measures it (run it under ``mpiexec`` at the ranks
asked about; docs/allreduce.md and docs/performance.md hold the figures).

Every input is one every rank holds alike (sizes and counts the argument check or the agreed
manifest compares, the communicator's size), so every rank gets the same answer and posts the
same collectives. A node mechanism chosen here still probes its peers on its first call and
answers False on every rank where it cannot run: the caller then takes :data:`MPI`. The switches
(``MPISYNC_CROSS_MEMORY``, ``MPISYNC_SHARED_MEMORY``) are read by the mechanisms, through
:mod:`mpisync.config`, as before.
"""

from __future__ import annotations

__all__ = [
    "MPI",
    "CROSS",
    "SHARED",
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
    "BUCKETS",
    "CROSS_REDUCE_MIN_BYTES",
    "CROSS_BROADCAST_MIN_BYTES",
    "SHARED_REDUCE_MIN_BYTES",
    "SHARED_REDUCE_MAX_BYTES",
    "BUCKETS_SEGMENT_MIN_BYTES",
    "BUCKETS_SEGMENT_MAX_BUCKETS",
    "PAIRWISE_MAX_RANKS",
    "choose",
    "parameter_set",
]

MPI = "mpi"
CROSS = "cross-memory"
SHARED = "shared memory"
PAIRWISE = "pairwise"

BROADCAST, ALLREDUCE, REDUCE = "broadcast", "allreduce", "reduce"
ALLGATHER, REDUCE_SCATTER, ALLTOALL = "allgather", "reduce_scatter", "alltoall"
OPERATIONS = (BROADCAST, ALLREDUCE, REDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL)

#: One contiguous array.
ARRAY = "array"
#: Several arrays (of one dtype for the reductions, read where they lie, as if end to end).
LIST = "list"
#: ``GradSync``'s fused buckets, packed in one arena (all-reduce only).
BUCKETS = "buckets"
_LAYOUTS = (ARRAY, LIST, BUCKETS)

# The smallest all-reduce, reduce, reduce-scatter and all-gather (bytes gathered) by
# cross-memory; below it the pinning of a peer's pages costs more than MPI's own copies.
# Measured by: mpiexec -n 2 mpisync bench --allreduce --rows collectives
#   --sizes 4194304 8388608 16777216 33554432 --max-bytes 33554432
CROSS_REDUCE_MIN_BYTES = 16 << 20
# The smallest broadcast of one array by cross-memory.
# Measured by: mpiexec -n 2 mpisync bench --allreduce --rows collectives
#   --sizes 2097152 4194304 8388608 16777216 --max-bytes 16777216
CROSS_BROADCAST_MIN_BYTES = 8 << 20
# The node segment's all-reduce of arrays reduced in their own memory: from this size two small
# collectives and two copies cost less than MPI's all-reduce ...
# Measured by: mpiexec -n 2 mpisync bench --allreduce --rows collectives
#   --sizes 131072 262144 524288 1048576 2097152 4194304 --max-bytes 4194304
SHARED_REDUCE_MIN_BYTES = 256 << 10
# ... up to this size (also each rank's region of that segment); above it MPI moves fewer bytes.
# Measured by the same command as SHARED_REDUCE_MIN_BYTES.
SHARED_REDUCE_MAX_BYTES = 2 << 20
# GradSync's fused buckets through the node's segment: from these fused bytes the segment's two
# barriers cost less than one MPI all-reduce of the bytes.
# Measured by: mpiexec -n 2 mpisync bench --allreduce --rows grads
BUCKETS_SEGMENT_MIN_BYTES = 24 << 10
# ... and up to this many buckets of fusion_bytes (each rank's region holds them all: the segment
# stays within what that many buckets in flight per rank would hold). A count, not a measurement.
BUCKETS_SEGMENT_MAX_BUCKETS = 16
# The most ranks an all-to-all of pieces sized by pair posts point-to-point messages for (a
# node's worth); beyond, one Ialltoallv. Measured by: mpiexec -n 4 mpisync bench --allreduce
#   --rows collectives (the all_to_all rows)
PAIRWISE_MAX_RANKS = 16


def choose(
    operation: str,
    nbytes: int,
    ranks: int,
    layout: str = ARRAY,
    node: bool = True,
    fusion_bytes: int = 0,
) -> str:
    """The mechanism for one collective: ``operation`` (one of :data:`OPERATIONS`) of ``nbytes``
    (this rank's input; for an all-gather the bytes gathered, for a reduce-scatter the whole
    input) over ``ranks`` ranks, its memory ``layout`` (:data:`ARRAY`, :data:`LIST` or
    :data:`BUCKETS`, the last with ``fusion_bytes``); ``node``: whether the node's mechanisms may
    take this call at all (the ranks on one node as far as the caller knows, an operation and
    dtype they combine). Returns :data:`MPI`, :data:`CROSS`, :data:`SHARED` or :data:`PAIRWISE`."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}, expected one of {OPERATIONS}")
    if layout not in _LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}, expected one of {_LAYOUTS}")
    if operation == ALLTOALL:  # pieces sized by pair (a list); an equal split is MPI's Ialltoall
        return PAIRWISE if layout == LIST and 1 < ranks <= PAIRWISE_MAX_RANKS else MPI
    if ranks < 2 or not node:
        return MPI
    if layout == BUCKETS:
        fits = BUCKETS_SEGMENT_MIN_BYTES <= nbytes <= BUCKETS_SEGMENT_MAX_BUCKETS * fusion_bytes
        return SHARED if operation == ALLREDUCE and fits else MPI
    if operation == BROADCAST:
        return CROSS if layout == ARRAY and nbytes >= CROSS_BROADCAST_MIN_BYTES else MPI
    if operation == ALLGATHER:
        return CROSS if layout == ARRAY and nbytes >= CROSS_REDUCE_MIN_BYTES else MPI
    if nbytes >= CROSS_REDUCE_MIN_BYTES:
        return CROSS
    if operation == REDUCE_SCATTER:
        return MPI
    return SHARED if SHARED_REDUCE_MIN_BYTES <= nbytes <= SHARED_REDUCE_MAX_BYTES else MPI


def parameter_set(small: bool, usable: dict, shared_setting: bool | None) -> tuple[str, str]:
    """``(mechanism, why)`` for one ``ParamSync`` broadcast of a parameter set whose ranks are all
    on one node: ``small`` (every tensor smaller than ``fusion_bytes``), ``usable`` (mechanism
    name -> whether it can run on every rank), ``shared_setting`` (``MPISYNC_SHARED_MEMORY``: True
    every set, False never, None sets of small tensors)."""
    if usable.get(SHARED) and shared_setting is True:
        return SHARED, "MPISYNC_SHARED_MEMORY=1, every rank on one node"
    if small and usable.get(SHARED):
        return SHARED, "every rank on one node, every tensor smaller than fusion_bytes"
    if not small and usable.get(CROSS):
        return CROSS, "every rank on one node, cross-memory copies permitted, large tensors"
    return MPI, "no single-copy transport applies"
