"""The host transports of one syncer: which one each sync takes, set up on first use, freed
together.

The choice follows :func:`mpisync.transports.selection.choose` over facts every rank
shares (gathered in one all-reduce posted with the communicator's
duplication), so every rank opens and uses the same transport. A transport
whose set-up failed on some rank is not offered again.
"""

from __future__ import annotations

from ..plan.arena import Arena
from . import spares
from .crossmemory import CrossTransport
from .mpi import MpiTransport
from .selection import CROSS, MPI, Choice, Facts, FactsExchange, choose

__all__ = ["HostTransports"]


class HostTransports:
    """Channel -> transport for one syncer (``None`` where a set-up failed on some rank)."""

    def __init__(self, root: int, one_shot: bool = False):
        self.root, self.one_shot = root, one_shot
        self.preferred: str | None = None  # a channel asked for (tests, the bench)
        self.facts: Facts | None = None  # once the exchange completed
        self.last_choice: Choice | None = None  # of the last sync
        self._open: dict = {}

    def post_facts(self, user_comm) -> FactsExchange:
        """Post the facts all-reduce on ``user_comm``."""
        return FactsExchange(user_comm)

    @property
    def nbytes(self) -> int:
        """Host bytes held between syncs by every transport set up."""
        return sum(t.nbytes for t in self._open.values() if t is not None)

    @property
    def traced_bytes(self) -> int:
        """The part of :attr:`nbytes` in plain memory (an arena not on a memory file)."""
        mpi = self._open.get(MPI)
        return len(mpi.arena) if mpi is not None and not mpi.arena.mapped else 0

    def get(self, channel: str):
        """The transport set up for ``channel``."""
        return self._open[channel]

    def choose(self, comm, small: bool, call) -> str:
        """The channel for a set (``small``: every host tensor under ``fusion_bytes``), set up on
        every
        rank on first use (collective: every rank makes the same choice from the same facts)."""
        assert self.facts is not None  # exchanged with the communicator's duplication
        while True:
            unavailable = tuple(c for c, t in self._open.items() if t is None)
            self.last_choice = choose(self.facts, small, self.preferred, unavailable)
            channel = self.last_choice.channel
            if channel not in self._open:
                self._open[channel] = self._set_up(comm, channel, call)
            transport = self._open[channel]
            if transport is not None and not (channel == CROSS and transport.failed):
                return channel
            # failed set-up, or a copy failed on some rank: not offered again
            self._open[channel] = None

    def _set_up(self, comm, channel: str, call):
        assert self.facts is not None  # see choose
        if channel == MPI:
            return MpiTransport(
                comm, self.root, spares.take(spares.ARENA) if self.one_shot else None
            )
        fallback = self._open.get(MPI) or MpiTransport(comm, self.root)
        self._open.setdefault(MPI, fallback)
        return CrossTransport.open(comm, self.root, call, fallback)

    def close(self, broken: bool) -> None:
        """Free every transport; after a timeout (``broken``) their buffers are kept out of use for
        good."""
        for channel, transport in self._open.items():
            if transport is None:
                continue
            if (
                channel == MPI
                and self.one_shot
                and not broken
                and len(transport.arena)
                # for the next sync_params call
                and spares.offer(spares.ARENA, transport.arena)
            ):
                transport.arena = Arena(0)
            transport.close(broken)
        self._open.clear()


TRANSPORTS = {MPI: MpiTransport, CROSS: CrossTransport}
