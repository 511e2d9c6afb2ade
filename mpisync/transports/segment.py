"""The ``shared memory`` transport: the node's shared segment
(:mod:`mpisync.transports.nodesegment`);
root copies into slots, the others copy out, with no MPI data movement; the slots' handshake is
the ordered counters of :meth:`~mpisync.transports.nodesegment.NodeSegment.run` (C11 atomics)."""

from __future__ import annotations

import logging as _logging

from .._runtime.keepalive import keep_alive
from .._runtime.observe import logger
from ..params.columns import HostColumns
from . import spares
from .base import Context, Transport, names_of
from .nodesegment import SLOT_BYTES, SMALL_SLOTS, NodeSegment, compile_chunks
from .selection import SHARED


def segment_geometry(capacity: int, fusion: int, every_set: bool) -> tuple[int, int]:
    """``(slots, slot bytes)`` of a shared segment. For sets of small tensors only:
    :data:`~mpisync.transports.nodesegment.SMALL_SLOTS` slots of one bucket; for any set
    (``every_set``)
    slots of at least ``SLOT_BYTES`` within ``capacity x fusion`` (two at least)."""
    if every_set:
        slot_bytes = max(SLOT_BYTES, fusion)
        return max(2, capacity * fusion // slot_bytes), slot_bytes
    return min(SMALL_SLOTS, max(2, capacity)), max(fusion, 1)


def spare_words(segment, comm, root: int, geometry: tuple) -> tuple:
    """``(token, mismatch)`` for the facts all-reduce: a spare is adopted only when every rank
    holds the
    same one (equal tokens) at the same rank, with the same root, size and ``geometry`` (no mismatch
    anywhere), so a syncer never holds more than its own settings allow."""
    if segment is None:
        return (0, 0)
    return (
        segment.token,
        int(
            segment.rank != comm.rank
            or segment.root != root
            or segment.size != comm.size
            or (segment.slots, segment.slot_bytes) != tuple(geometry)
        ),
    )


class SegmentTransport(Transport[HostColumns, list]):
    """The node's shared segment: root copies into slots, the others copy out (no MPI data
    movement)."""

    name = SHARED

    def __init__(self, comm, root: int, segment: NodeSegment):
        super().__init__(comm, root)
        self.segment = segment
        # the last run completed: every rank's counters agree, so it may serve again
        self.clean = True

    @classmethod
    def open(cls, comm, root: int, call, geometry: tuple[int, int]) -> SegmentTransport | None:
        """Set the segment up on every rank (root's ``geometry``: see :func:`segment_geometry`), or
        None on every rank."""
        segment = NodeSegment.open(comm, root, *geometry, call, True)
        return cls(comm, root, segment) if segment is not None else None

    @property
    def nbytes(self) -> int:
        return self.segment.nbytes

    def compile(self, columns, plan: list, fusion: int, ctx: Context):
        node = self.segment
        return compile_chunks(
            columns, plan, receiving=self.receiving, slots=node.slots, slot_bytes=node.slot_bytes
        )

    def run(self, program, ctx: Context) -> None:
        timeline, deadline = ctx.timeline, ctx.deadline
        start = timeline.now()

        def log(k, chunk):
            logger.debug(
                "slot %d/%d: %d bytes through shared memory: %s",
                k + 1,
                len(program),
                chunk.nbytes,
                names_of(chunk.label),
            )

        self.clean = False
        self.segment.run(
            program,
            deadline.at,
            timeline.active,
            log if logger.isEnabledFor(_logging.DEBUG) else None,
            self.comm,
        )
        self.clean = True
        timeline.span("broadcast", start, chunks=len(program), channel="shared memory")

    def close(self, broken: bool = False, keep: bool = False) -> None:
        """``keep``: offer the segment to the next syncer of these ranks (when its last run
        completed)."""
        if broken:
            keep_alive(self.segment)
        elif keep and self.clean:
            spares.offer(spares.SEGMENT, self.segment)
        # a closed transport is not used again: the assignment ignore
        self.segment = None  # type: ignore[assignment]
