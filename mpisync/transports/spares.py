"""The fusion arena a closed one-shot ``sync_params`` hands on to the next one: one spare at most.

Touching the pages of a fresh fusion arena costs more than a sync of many small tensors
(docs/performance.md). A one-shot syncer whose last run completed offers its arena; the next
one takes it.
"""

from __future__ import annotations

__all__ = ["ARENA", "offer", "take"]

ARENA = "arena"

_SPARES: dict = {ARENA: []}


def take(kind: str):
    """The spare of ``kind`` (removed from the pool), or None."""
    try:
        return _SPARES[kind].pop()
    except IndexError:  # none, or another thread took it
        return None


def offer(kind: str, spare) -> bool:
    """Put ``spare`` in the pool of ``kind``; False (and nothing kept) when the pool already holds
    one."""
    pool = _SPARES[kind]
    if spare is None or pool:
        return False
    pool.append(spare)
    return True
