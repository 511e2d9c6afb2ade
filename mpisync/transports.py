"""Transports move root's host bytes into every rank's masters, behind one small interface.

A transport is set up once per syncer (``open``, collective), compiles a
program for one prepared parameter set (``compile``, local), runs it within
the sync's deadline (``run``, collective) and frees its buffers (``close``).
:data:`TRANSPORTS` maps the names :mod:`mpisync.selection` chooses to classes:

- ``mpi``: nonblocking broadcasts through the request ring, small tensors
  packed into fusion buckets of an arena;
- ``cross-memory``: tensors copied process to process (:mod:`mpisync.crossmemory`);
- ``shared memory``: a ring of slots in a file every rank maps (:mod:`mpisync.intranode`).

The device transport (staged or CUDA-aware) is :mod:`mpisync.devicepath`.
"""

from __future__ import annotations

import abc as _abc
import functools as _functools
import logging as _logging

import numpy as _np
from mpi4py import MPI

from .arena import Arena
from .arrays import _byte_view
from .bulk import BulkManifest, bulk_plan, compile_bulk, compile_bulk_chunks
from .crossmemory import CrossMemory
from .intranode import SLOT_BYTES, SMALL_SLOTS, NodeSegment, compile_chunks
from .fanout import copy_host, replica_copies
from .observe import logger
from .plan import build_plan
from .program import arena_slots, compile_program, fused_slots, transfer_buffer
from .ring import TrackedRing
from .selection import CROSS, MPI as MPI_NAME, SHARED
from .speedups import speedups as _speedups

__all__ = ["Transport", "MpiTransport", "CrossTransport", "SegmentTransport", "TRANSPORTS", "Context",
           "host_plan", "quarantine"]

# Buffers of a syncer whose sync timed out: collectives may still write into them, so they are kept
# alive (never freed, never reused) for the rest of the process.
_quarantined: list = []


def quarantine(*buffers) -> None:
    """Keep ``buffers`` alive and out of use for the rest of the process."""
    _quarantined.extend(b for b in buffers if b is not None)


class Context:
    """What one sync's run needs: the communicator, root, a wait helper, the report and the timeline."""

    __slots__ = ("comm", "root", "call", "deadline", "report", "timeline", "capacity", "one_node", "pending")

    def __init__(self, comm, root, deadline, report, timeline, capacity: int, one_node: bool):
        self.comm, self.root, self.deadline, self.call = comm, root, deadline, deadline.wait
        self.report, self.timeline, self.capacity, self.one_node = report, timeline, capacity, one_node
        self.pending = None  # names in flight when a wait expires: a callable, set by the running transport


def host_plan(manifest, fusion: int, chunk: int, runs: tuple = ()) -> list:
    """The host plan of ``manifest``: ``bulk_plan`` tuples for a bulk manifest, else ``build_plan``'s."""
    if isinstance(manifest, BulkManifest):
        return bulk_plan(manifest.sizes, fusion, chunk)
    return build_plan([p.nbytes for p in manifest.host_params], fusion, chunk, runs)


def _fused_count(plan: list) -> int:
    return sum(1 for t in plan if (t[0] if isinstance(t, tuple) else t.fused))


class Transport(_abc.ABC):
    """Set up for a syncer, compile per parameter set, run per sync, close once."""

    name = ""

    def __init__(self, comm, root: int):
        self.comm, self.root = comm, root
        self.receiving = comm.rank != root

    @property
    def nbytes(self) -> int:
        """Host bytes this transport holds between syncs."""
        return 0

    @_abc.abstractmethod
    def compile(self, manifest, plan: list, fusion: int, ctx: Context):
        """This rank's program for ``plan`` over ``manifest``'s host arrays (local, no communication)."""

    def bind(self, program, ctx: Context) -> None:
        """Exchange what peers need about a fresh program (collective; most transports need nothing)."""

    @_abc.abstractmethod
    def run(self, program, ctx: Context) -> None:
        """Move root's bytes (collective); raises :class:`~mpisync.ring.Expired` past the deadline."""

    def close(self, broken: bool = False) -> None:
        """Free the buffers (kept alive for good when ``broken``: collectives may still write)."""


class MpiTransport(Transport):
    """Nonblocking broadcasts through the request ring; small tensors packed in an arena's buckets."""

    name = MPI_NAME

    def __init__(self, comm, root: int, arena: Arena | None = None):
        super().__init__(comm, root)
        self.arena = arena if arena is not None else Arena(0)

    @property
    def nbytes(self) -> int:
        return len(self.arena)

    def _ensure_arena(self, needed: int) -> bool:
        """An arena of at least ``needed`` bytes; True when a new one replaced the old."""
        if len(self.arena) >= needed:
            return False
        self.arena = Arena(needed, vectored=False if _speedups is not None else None)
        return True

    def compile(self, manifest, plan: list, fusion: int, ctx: Context):
        if isinstance(manifest, BulkManifest):
            self._ensure_arena(fused_slots(ctx.capacity, _fused_count(plan), ctx.one_node) * fusion)
            return compile_bulk(manifest, plan, receiving=self.receiving, arena=self.arena, fusion_bytes=fusion)
        self._ensure_arena(arena_slots(plan, ctx.capacity, ctx.one_node) * fusion)
        return compile_program(manifest.host_params, plan, receiving=self.receiving, arena=self.arena,
                               fusion_bytes=fusion)

    def run(self, program, ctx: Context) -> None:
        comm, root, timeline = self.comm, self.root, ctx.timeline
        ring = TrackedRing(ctx.capacity, ctx.deadline.timeout)
        ctx.pending = ring.pending_labels
        debug = logger.isEnabledFor(_logging.DEBUG)
        start = timeline.now()
        for k, step in enumerate(program):
            ring.make_room()
            if step.after >= 0:  # the bucket that used this arena slot before is done and unpacked
                ring.retire_through(step.after)
            step.start(timeline.active)
            if debug:
                logger.debug("Ibcast %d/%d: %d bytes from root %d, %s: %s", k + 1, len(program),
                             len(step.buffer[0]), root, "fused" if step.fused else "direct", _names(step.label))
            request = comm.Ibcast(step.buffer, root)
            if not (step.unpack or step.fan_out):
                done = None
            elif timeline.active is not None:
                done = _functools.partial(step.finish, timeline.active)
            else:
                done = step.finish
            ring.push(request, done, step.label)
        ring.drain()
        timeline.span("broadcast", start, collectives=len(program), bytes=sum(len(s.buffer[0]) for s in program))
        ctx.report.collectives += len(program)

    def close(self, broken: bool = False) -> None:
        if broken:
            quarantine(self.arena)
        self.arena = Arena(0)


# One segment left by a closed syncer (sync_params' included), offered to the next syncer of the same
# ranks: mapping a fresh segment costs more than a sync of many small tensors (docs/performance.md).
_spare_segments: list = []


def take_spare_segment():
    """The spare segment (removed from the pool), or None."""
    try:
        return _spare_segments.pop()
    except IndexError:
        return None


def offer_spare_segment(segment) -> None:
    """Put ``segment`` in the pool (one at most; a second is dropped)."""
    if segment is not None and not _spare_segments:
        _spare_segments.append(segment)


def segment_geometry(capacity: int, fusion: int, every_set: bool) -> tuple:
    """``(slots, slot bytes)`` of a shared segment. For sets of small tensors only:
    :data:`~mpisync.intranode.SMALL_SLOTS` slots of one bucket; for any set (``every_set``)
    slots of at least ``SLOT_BYTES`` within ``capacity x fusion`` (two at least)."""
    if every_set:
        slot_bytes = max(SLOT_BYTES, fusion)
        return max(2, capacity * fusion // slot_bytes), slot_bytes
    return min(SMALL_SLOTS, max(2, capacity)), max(fusion, 1)


def spare_words(segment, comm, root: int, geometry: tuple) -> tuple:
    """``(token, mismatch)`` for the facts all-reduce: a spare is adopted only when every rank holds the
    same one (equal tokens) at the same rank, with the same root, size and ``geometry`` (no mismatch
    anywhere), so a syncer never holds more than its own settings allow."""
    if segment is None:
        return (0, 0)
    return (segment.token, int(segment.rank != comm.rank or segment.root != root or segment.size != comm.size
                               or (segment.slots, segment.slot_bytes) != tuple(geometry)))


class SegmentTransport(Transport):
    """The node's shared segment: root copies into slots, the others copy out (no MPI data movement)."""

    name = SHARED

    def __init__(self, comm, root: int, segment: NodeSegment):
        super().__init__(comm, root)
        self.segment = segment
        self.clean = True  # the last run completed: every rank's counters agree, so it may serve again

    @classmethod
    def open(cls, comm, root: int, call, geometry: tuple) -> SegmentTransport | None:
        """Set the segment up on every rank (root's ``geometry``: see :func:`segment_geometry`), or
        None on every rank."""
        segment = NodeSegment.open(comm, root, *geometry, call, True)
        return cls(comm, root, segment) if segment is not None else None

    @property
    def nbytes(self) -> int:
        return self.segment.nbytes

    def compile(self, manifest, plan: list, fusion: int, ctx: Context):
        node = self.segment
        if isinstance(manifest, BulkManifest):
            return compile_bulk_chunks(manifest, plan, receiving=self.receiving, slots=node.slots,
                                       slot_bytes=node.slot_bytes)
        return compile_chunks(plan, manifest.host_params, receiving=self.receiving, slots=node.slots,
                              slot_bytes=node.slot_bytes)

    def run(self, program, ctx: Context) -> None:
        timeline, deadline = ctx.timeline, ctx.deadline
        start = timeline.now()
        def log(k, chunk):
            logger.debug("slot %d/%d: %d bytes through shared memory: %s", k + 1, len(program), chunk.nbytes,
                         _names(chunk.label))
        self.clean = False
        self.segment.run(program, deadline.at, timeline.active, log if logger.isEnabledFor(_logging.DEBUG) else None)
        self.clean = True
        timeline.span("broadcast", start, chunks=len(program), channel="shared memory")

    def close(self, broken: bool = False, keep: bool = False) -> None:
        """``keep``: offer the segment to the next syncer of these ranks (when its last run completed)."""
        if broken:
            quarantine(self.segment)
        elif keep and self.clean:
            offer_spare_segment(self.segment)
        self.segment = None


class CrossTransport(Transport):
    """Tensors copied process to process; a failed copy on any rank redoes the sync through MPI."""

    name = CROSS

    def __init__(self, comm, root: int, cross: CrossMemory, fallback: MpiTransport):
        super().__init__(comm, root)
        self.cross, self.fallback = cross, fallback
        self.failed = False  # a copy failed once: every rank keeps MPI from then on

    @classmethod
    def open(cls, comm, root: int, call, fallback: MpiTransport) -> CrossTransport | None:
        """Probe every pair on every rank; the transport, or None on every rank."""
        cross = CrossMemory.open(comm, root, call, None)
        return cls(comm, root, cross, fallback) if cross is not None else None

    def compile(self, manifest, plan: list, fusion: int, ctx: Context):
        # Every rank's lists must have the same lengths (bind all-gathers them with one count), and
        # ranks may hold the same set on different paths: empty tensors are left out on both.
        if isinstance(manifest, BulkManifest):
            values, sizes = manifest.values, manifest.sizes
            direct = [_byte_view(values[i])[off:off + n] for fused, i, off, n in plan if not fused and n]
            small = [_byte_view(values[i]) for fused, first, last, _ in plan if fused
                     for i in range(first, last) if sizes[i]]
            return _CrossProgram(manifest, plan, fusion, direct, small, ())
        host = manifest.host_params
        direct = [b for b in (transfer_buffer(host, t) for t in plan if not t.fused) if len(b)]
        small = [host[i].master.data for t in plan if t.fused for i, _, _, _ in t.pieces if host[i].nbytes]
        return _CrossProgram(manifest, plan, fusion, direct, small, replica_copies(host, range(len(host))))

    def bind(self, program, ctx: Context) -> None:
        program.copies = self.cross.bind(self.comm, program.direct, program.small, ctx.call)

    def run(self, program, ctx: Context) -> None:
        timeline = ctx.timeline
        begin = started = timeline.now()
        copied = program.copies is not None and program.copies.run()
        timeline.span("cross-memory", begin, tensors=len(program.direct) + len(program.small))
        everyone = _np.zeros(1, dtype=_np.int64)
        # Root's masters must not change before every receiver has read them, nor a receiver's
        # before root has written them: nobody leaves the sync before this all-reduce.
        ctx.call(self.comm.Iallreduce(_np.array([int(bool(copied))], dtype=_np.int64), everyone, op=MPI.MIN))
        if everyone[0]:
            begin = timeline.now()
            copy_host(program.fan_out)
            timeline.span("fan-out", begin, copies=len(program.fan_out))
            logger.debug("cross-memory: %d direct transfers and %d small tensors copied process to process",
                         len(program.direct), len(program.small))
            timeline.span("broadcast", started, channel="cross-memory")
            return
        logger.warning("rank %d: cross-memory copies failed on some rank; every rank redoes them through MPI "
                       "now and keeps MPI", self.comm.rank)
        self.failed = True
        steps = self.fallback.compile(program.manifest, program.plan, program.fusion, ctx)
        self.fallback.run(steps, ctx)

    def close(self, broken: bool = False) -> None:
        self.cross = None


class _CrossProgram:
    __slots__ = ("manifest", "plan", "fusion", "direct", "small", "fan_out", "copies")

    def __init__(self, manifest, plan, fusion, direct, small, fan_out):
        self.manifest, self.plan, self.fusion = manifest, plan, fusion
        self.direct, self.small, self.fan_out, self.copies = direct, small, fan_out, None


def _names(label) -> str:
    return ", ".join(label[:5]) + (f", ... ({len(label)} tensors)" if len(label) > 5 else "")


TRANSPORTS = {MPI_NAME: MpiTransport, CROSS: CrossTransport, SHARED: SegmentTransport}
