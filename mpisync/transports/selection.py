"""Which transport moves host bytes: decided before the first sync, the same on every rank.

No sync is spent trying transports. A syncer's first sync gathers a few
facts in one small all-reduce (every rank on one node? may every rank use
cross-memory copies?); each sync then applies
:func:`choose` (whose rule is :func:`mpisync.transports.policy.parameter_set`) to
those facts and to what validation already made common (every host tensor
smaller than ``fusion_bytes``?). Every input is the same on
every rank, so the choice is too. A tuning file that ``mpisync tune`` wrote
on the same machine, MPI library and rank layout replaces the built-in rule
(see :mod:`mpisync.transports.tuning`). The figures behind the rule are in
docs/performance.md.
"""

from __future__ import annotations

import array as _array
import typing as _typing

from mpi4py import MPI as _MPI

from . import cma as _crossmemory
from .policy import CROSS, MPI, parameter_set
from .tuning import CLASSES, lookup

__all__ = [
    "Facts",
    "Choice",
    "FactsExchange",
    "gather_facts",
    "choose",
    "MPI",
    "CROSS",
    "CHANNELS",
]

CHANNELS = (MPI, CROSS)


class Facts(_typing.NamedTuple):
    """What every rank shares about the job, gathered once per syncer."""

    size: int
    one_node: bool  # every rank on one node, as MPI names nodes
    cross: bool  # cross-memory copies permitted and possible on every rank
    # the tuning file's channel for small sets and for the rest (mpisync.transports.tuning)
    tuned: tuple = (None, None)

    def layout(self) -> str:
        """The rank layout a tuning entry is for: ``"<size>x1"`` on one node, else
        ``"<size>-ranks-multinode"``."""
        return f"{self.size}x1" if self.one_node else f"{self.size}-ranks-multinode"


class Choice(_typing.NamedTuple):
    """A transport for host bytes and why it was chosen."""

    channel: str
    why: str


def local_facts(size: int) -> tuple:
    """This rank's words for :func:`gather_facts`: node, cross-memory permitted, and the tuning
    file's channels for small sets and the rest (as if every rank were on this node: entries
    apply only then)."""
    return (_crossmemory.host_word(), int(_crossmemory.enabled()), *tuned_words(f"{size}x1"))


def tuned_words(layout: str) -> tuple:
    """This rank's tuned channels as words for the facts all-reduce: an index into
    :data:`CHANNELS` per class of :data:`mpisync.transports.tuning.CLASSES`, -1 where none."""
    try:
        entries, _ = lookup(layout)
    # raised here, before the facts all-reduce, it would leave the other ranks waiting
    except Exception:
        entries = {}
    return tuple(CHANNELS.index(entries[c]) if entries.get(c) in CHANNELS else -1 for c in CLASSES)


class FactsExchange:
    """The facts all-reduce, posted early (with the communicator's duplication, so its round trip
    overlaps the manifest's construction) and completed by :meth:`result`."""

    def __init__(self, comm, words: _typing.Sequence[int] | None = None):
        words = [int(w) for w in (local_facts(comm.size) if words is None else words)]
        self.size, self.count = comm.size, len(words)
        # MAX of the words and of their complements: max and min in one all-reduce (see agreement).
        self.send = _array.array("q", words + [~w for w in words])
        self.recv = _array.array("q", bytes(len(self.send) * 8))
        self.request = comm.Iallreduce(self.send, self.recv, op=_MPI.MAX)

    def result(self, call) -> Facts:
        """Wait (``call(request)``) and return the facts."""
        call(self.request)
        n = self.count
        high, low = self.recv[:n].tolist(), [~w for w in self.recv[n:]]
        # A tuning entry that differs between ranks counts as unset: every rank decides alike.
        tuned = tuple(
            CHANNELS[h] if h == lo and h >= 0 else None for h, lo in zip(high[2:4], low[2:4])
        )
        return Facts(self.size, high[0] == low[0], bool(low[1]), tuned)


def gather_facts(comm, call, words: tuple | None = None) -> Facts:
    """The facts every rank of ``comm`` shares, from one all-reduce (``call`` waits for it)."""
    return FactsExchange(comm, words).result(call)


def choose(
    facts: Facts, small: bool, preferred: str | None = None, unavailable: tuple = ()
) -> Choice:
    """The channel for a set (``small``: every host tensor smaller than ``fusion_bytes``).

    ``preferred`` (tests, the bench) and then the tuning file's entry win where possible;
    ``unavailable`` lists channels whose set-up failed on some rank.
    """
    tuned = facts.tuned[0 if small else 1]
    usable = {
        MPI: True,
        CROSS: facts.one_node and facts.cross and CROSS not in unavailable,
    }
    if preferred is not None and usable.get(preferred):
        return Choice(preferred, "asked for")
    if facts.size < 2:
        return Choice(MPI, "one rank")
    if not facts.one_node:
        return Choice(MPI, "ranks on several nodes")
    if tuned is not None and usable.get(tuned):
        return Choice(tuned, "tuning file")
    return Choice(*parameter_set(small, usable[CROSS]))
