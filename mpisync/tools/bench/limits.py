"""The limit row: an operation's bytes moved by the least work it needs, as local memory copies
and adds, on every rank's core at once.

A collective between ranks on one node moves bytes from one process's memory
into another's; however it does it (MPI, cross-memory copies, a shared
memory segment), each byte it delivers is read once and written once, and each byte
it reduces is read and added once. The same reads, adds and writes done by
each rank on its own memory, all ranks at once (one core each), need no
synchronisation, no page mapping and no second copy, so no transfer can beat
them on the same cores: ``limit time / row time`` is the fraction of the
machine's memory speed a row reaches (1.0: at the limit).

Per rank, for an operation on ``B`` bytes at ``n`` ranks (:func:`work`):

- broadcast (``B``: the message): the ``n - 1`` receivers each need ``B``
  bytes written, ``(n - 1) B`` in all, shared by the ``n`` cores: each rank
  copies ``(n - 1) / n * B``;
- reduce-scatter (``B``: each rank's input): each rank owns a slice of
  ``B / n`` and reads and adds its ``n - 1`` peers' slices into it:
  ``(n - 1) / n * B`` added;
- all-gather (``B``: the gathered output): each rank copies the ``n - 1``
  slices it lacks: ``(n - 1) / n * B`` copied;
- all-gather out of place (``B``: the gathered output; each rank's input is
  not its slice of the output): each rank also copies its own input into
  its slice: ``B`` copied;
- all-reduce (``B``: each rank's buffer): a reduce-scatter, then an
  all-gather of the reduced slices;
- reduce (``B``: each rank's buffer, to ``root``): a reduce-scatter, then
  ``root`` alone copies the ``n - 1`` reduced slices.

The limit's time of one iteration is the slowest rank's (all start after a
barrier, :mod:`mpisync.tools.bench.timing`); tables show the median.
"""

from __future__ import annotations

import dataclasses as _dc

import numpy as _np

from .buffers import written
from .timing import Timing, measure

__all__ = ["OPERATIONS", "Work", "LimitRun", "work", "limit_run", "measure_limit"]

OPERATIONS = (
    "broadcast",
    "all-reduce",
    "reduce",
    "reduce-scatter",
    "all-gather",
    "all-gather out of place",
)
_FLOAT = _np.dtype(_np.float32)


@_dc.dataclass(frozen=True)
class Work:
    """One rank's share of an operation's least work: bytes read and added into its own slice
    (``add``, float32), then bytes copied (``copy``)."""

    add: int
    copy: int


def work(operation: str, nbytes: int, ranks: int, rank: int = 0, root: int = 0) -> Work:
    """``rank``'s share of the least work of ``operation`` on ``nbytes`` at ``ranks`` ranks.

    ``nbytes``: the message of a broadcast, each rank's buffer of an all-reduce or reduce, each
    rank's input of a reduce-scatter, the gathered output of an all-gather (either form)."""
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; choose from {', '.join(OPERATIONS)}")
    if ranks < 1 or nbytes < 0 or not 0 <= rank < ranks:
        raise ValueError(f"need ranks >= 1, nbytes >= 0, 0 <= rank < ranks; got {ranks}, {nbytes}")
    share = nbytes * (ranks - 1) // ranks
    if operation == "broadcast":
        return Work(0, share)
    if operation == "all-gather":
        return Work(0, share)
    if operation == "all-gather out of place":
        return Work(0, nbytes)
    if operation == "reduce-scatter":
        return Work(share, 0)
    if operation == "all-reduce":
        return Work(share, share)
    return Work(share, share if rank == root else 0)  # reduce


class LimitRun:
    """One rank's share of an operation's least work on buffers it wrote; calling it does it
    once."""

    def __init__(self, share: Work, ranks: int):
        peers = max(1, ranks - 1)
        self.slice = written(share.add // _FLOAT.itemsize // peers, _FLOAT)
        self.peers = written(self.slice.size * peers, _FLOAT)
        # the copy reads the peers' bytes where there are enough of them (they are written)
        spare = self.peers.view(_np.uint8)
        self.source = spare[: share.copy] if spare.size >= share.copy else written(share.copy)
        self.target = written(share.copy)
        self.work = share

    def __call__(self) -> None:
        n = self.slice.size
        for start in range(0, self.peers.size if n else 0, n or 1):
            _np.add(self.slice, self.peers[start : start + n], out=self.slice)
        _np.copyto(self.target, self.source)


def limit_run(comm, operation: str, nbytes: int, root: int = 0) -> LimitRun:
    """This rank's :class:`LimitRun` of ``operation`` on ``nbytes`` at ``comm.size`` ranks."""
    return LimitRun(work(operation, nbytes, comm.size, comm.rank, root), comm.size)


def measure_limit(
    comm, operation: str, nbytes: int, *, iterations: int, warmup: int = 1, root: int = 0
) -> Timing:
    """The limit row alone: every rank does its share after a barrier; each sample is the slowest
    rank's time. (The bench times it interleaved with the rows it bounds instead.)"""
    return measure(
        comm, limit_run(comm, operation, nbytes, root), iterations=iterations, warmup=warmup
    )
