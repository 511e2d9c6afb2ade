"""An all-to-all as one message each way per peer, straight between the callers' buffers.

On one node MPICH's ``Ialltoallv`` is slower than its ``Ialltoall`` of the same bytes; one
``Irecv`` and one ``Isend`` per peer keep ``Ialltoall``'s pace with sizes that differ by pair and
without packing pieces into one buffer (figures: docs/allreduce.md, "``all_to_all`` of tensor
lists"). Each request is one more for the caller to wait on, so beyond
:data:`~mpisync.transports.policy.PAIRWISE_MAX_RANKS` one ``Ialltoallv`` is left to do it.
"""

from __future__ import annotations

import numpy as _np

__all__ = ["pieces", "post"]


def pieces(buffer: _np.ndarray, counts: list) -> list:
    """``buffer`` cut into consecutive pieces of ``counts`` bytes (its tail past them left out)."""
    ends = _np.cumsum([0, *counts]).tolist()
    return [buffer[a:b] for a, b in zip(ends[:-1], ends[1:])]


def post(comm, tag: int, receives: list, sends: list) -> list:
    """Post ``comm``'s all-to-all with ``tag``: ``sends[j]`` to rank ``j``, ``receives[j]`` from
    it (contiguous byte arrays; this rank's own pair of the same size), and copy this rank's own
    piece while the messages fly; returns the requests. Receives from ``rank + s`` and sends to
    ``rank - s``, so that every pair's messages are posted early on both sides. Every rank of
    ``comm`` posts its messages with the same ``tag`` in the same order of operations: MPI
    matches them in the order they were posted."""
    rank, size = comm.Get_rank(), comm.Get_size()
    requests = []
    for step in range(1, size):
        peer = (rank + step) % size
        requests.append(comm.Irecv(receives[peer], peer, tag))
    for step in range(1, size):
        peer = (rank - step) % size
        requests.append(comm.Isend(sends[peer], peer, tag))
    receives[rank][...] = sends[rank]
    return requests
