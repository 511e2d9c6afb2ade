"""Which channel moves host bytes between ranks, chosen by measurement on every rank alike.

Cross-memory copies (:mod:`mpisync.crossmemory`) and the node's shared segment
(:mod:`mpisync.intranode`; by default for sets of small tensors only) beat MPI
by up to 1.8x here, but the segment ran at a quarter of MPI's speed on some
runs of this (virtual) machine with large tensors. So a
:class:`~mpisync.ParamSync` measures instead of guessing: its first three syncs
use MPI, the next ones each other channel every rank can use, three syncs each
(the first sets the channel up, the best of the other two counts), and later
ones whichever moved its bytes fastest. Each rank's broadcast time
rides to the others in the next validation all-reduce, which yields the
slowest rank's time on every rank, so every rank makes the same choice.
"""

from __future__ import annotations

__all__ = ["ChannelTrial", "MPI_CHANNEL", "CROSS_CHANNEL", "SHARED_CHANNEL", "TIMED_SYNCS"]

MPI_CHANNEL = "mpi"
CROSS_CHANNEL = "cross-memory"
SHARED_CHANNEL = "shared memory"


#: Timed syncs per channel; the best counts (one sync of 5000 tiny tensors is about 1 ms, and a
#: single timing of it picked the slower channel in 2 of 3 runs here).
TIMED_SYNCS = 2


class ChannelTrial:
    """The trial: ``choose()`` before a sync, ``moved()`` after its host broadcast, ``record()``
    with the slowest rank's time of that broadcast once the next validation brings it."""

    def __init__(self):
        self.rates: dict = {}  # channel -> best bytes per microsecond of the slowest rank
        self.timed: dict = {}  # channel -> syncs timed so far
        self._last = None  # (channel, bytes) of the last host broadcast, if it is timed
        self._channel = None  # the channel of the last host broadcast
        self.elapsed_us = 0  # this rank's time for it, sent with the next validation

    def prefer(self, channel: str, channels: tuple) -> None:
        """Skip the trial: ``channel`` ranks first among ``channels`` from now on."""
        self.rates.update({c: float(c == channel) for c in channels})
        self.timed.update({c: TIMED_SYNCS for c in channels})

    def record(self, slowest_us: int) -> None:
        """Take the slowest rank's time of the last host broadcast (during the trial only)."""
        if self._last is not None and slowest_us > 0:
            channel, nbytes = self._last
            if self.timed.get(channel, 0) < TIMED_SYNCS:
                self.rates[channel] = max(self.rates.get(channel, 0.0), nbytes / slowest_us)
                self.timed[channel] = self.timed.get(channel, 0) + 1
        self._last, self.elapsed_us = None, 0

    def choose(self, possible: tuple) -> str:
        """The channel for this sync among ``possible`` (MPI first): the first one not timed enough
        yet, then the fastest."""
        for channel in possible:
            if self.timed.get(channel, 0) < TIMED_SYNCS:
                return channel
        return max(possible, key=self.rates.__getitem__)

    def settled(self, possible: tuple) -> bool:
        """Whether every channel in ``possible`` was timed enough (the choice no longer changes)."""
        return all(self.timed.get(channel, 0) >= TIMED_SYNCS for channel in possible)

    def moved(self, channel: str, nbytes: int, elapsed_s: float) -> None:
        """Note this rank's host broadcast: ``nbytes`` over ``channel`` in ``elapsed_s`` seconds.

        A channel's first sync in a row is not timed: on it, ranks rebuilt their steps and exchanged
        addresses at different speeds, and the slowest rank's time would count the others' set-up
        (a cross-memory sync of 5000 tensors timed at 13 ms that way, 1.3 ms after).
        """
        warm = channel == self._channel
        self._channel = channel
        self._last = (channel, nbytes) if warm else None
        self.elapsed_us = max(1, int(elapsed_s * 1e6)) if warm else 0
