"""Which channel moves host bytes between ranks, chosen by measurement on every rank alike.

The node's shared segment (:mod:`mpisync.intranode`, opt-in) beat MPI by up
to 1.8x here, but on some runs of this (virtual) machine it ran at a quarter
of MPI's speed. So a :class:`~mpisync.ParamSync` measures instead of guessing:
its first sync uses MPI, its second the shared segment (where every rank asked
for it and can map it), and later ones whichever moved its bytes faster. Each rank's broadcast time
rides to the others in the next validation all-reduce, which yields the
slowest rank's time on every rank, so every rank makes the same choice.
"""

from __future__ import annotations

__all__ = ["ChannelTrial", "MPI_CHANNEL", "SHARED_CHANNEL"]

MPI_CHANNEL = "mpi"
SHARED_CHANNEL = "shared memory"


class ChannelTrial:
    """The trial: ``choose()`` before a sync, ``moved()`` after its host broadcast, ``record()``
    with the slowest rank's time of that broadcast once the next validation brings it."""

    def __init__(self):
        self.rates: dict = {}  # channel -> bytes per microsecond of the slowest rank
        self._last = None  # (channel, bytes) of the last host broadcast
        self.elapsed_us = 0  # this rank's time for it, sent with the next validation

    def record(self, slowest_us: int) -> None:
        """Take the slowest rank's time of the last host broadcast (first measurement per channel)."""
        if self._last is not None and slowest_us > 0:
            channel, nbytes = self._last
            self.rates.setdefault(channel, nbytes / slowest_us)
        self._last, self.elapsed_us = None, 0

    def choose(self, shared_possible: bool) -> str:
        """The channel for this sync: MPI, then the shared segment, then the faster of the two."""
        if not shared_possible or MPI_CHANNEL not in self.rates:
            return MPI_CHANNEL
        if SHARED_CHANNEL not in self.rates:
            return SHARED_CHANNEL
        return max((MPI_CHANNEL, SHARED_CHANNEL), key=self.rates.__getitem__)

    @property
    def settled(self) -> bool:
        """Whether both channels were measured (the choice no longer changes)."""
        return len(self.rates) == 2

    def moved(self, channel: str, nbytes: int, elapsed_s: float) -> None:
        """Note this rank's host broadcast: ``nbytes`` over ``channel`` in ``elapsed_s`` seconds."""
        self._last = (channel, nbytes)
        self.elapsed_us = max(1, int(elapsed_s * 1e6))
