"""Buffers a closed syncer hands on to the next one: one spare of each kind at most.

Mapping a fresh shared segment, or touching the pages of a fresh fusion
arena, costs more than a sync of many small tensors (docs/performance.md). A
closed syncer whose last run completed offers what it held; the next syncer
takes it: a shared segment (``SEGMENT``, adopted only when every rank holds
the same one, see :func:`mpisync.transports.segment.spare_words`) and the
fusion arena of a one-shot ``sync_params`` (``ARENA``).
"""

from __future__ import annotations

__all__ = ["ARENA", "SEGMENT", "offer", "take"]

ARENA = "arena"
SEGMENT = "segment"

_SPARES: dict = {ARENA: [], SEGMENT: []}


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
