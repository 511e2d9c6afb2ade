"""The all-reduce's transport: a reduce set's collectives behind the interface of the broadcast
transports (:class:`mpisync.transports.base.Transport`).

Every step is an ``Iallreduce`` through the request ring (at most ``capacity`` in flight), large
tensors in place in their own memory. On one node the tensors reduced in their own memory take
the node's paths, one dtype at a time, at the sizes :mod:`mpisync.transports.policy` gives: by
cross-memory (:mod:`mpisync.transports.crossreduce`), through the node's segment
(:mod:`mpisync.transports.sharedreduce`); and the fused buckets go through the node's shared
regions (:class:`~mpisync.allreduce.segment.ReduceSegment`: two barriers, no MPI data movement).
Each path is chosen from the first call on, by sizes alone: a path that changed after some calls
would sum in another order, and a call repeated on the same inputs must give the same bytes.
"""

from __future__ import annotations

import contextlib as _contextlib
import typing as _typing

from mpi4py import MPI

from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired, TrackedRing
from ..plan.arena import Arena
from ..transports import policy as _policy
from ..transports.base import Context, Transport
from ..transports.crossreduce import drive, opened
from ..transports.policy import CROSS, SHARED
from ..transports.policy import MPI as MPI_NAME
from ..transports.sharedreduce import opened as shared_opened
from . import ops as _ops
from .plan import ReducePlan, fused_arena
from .reduceset import ReduceSet
from .segment import ReduceSegment

__all__ = ["ReduceProgram", "ReduceTransport"]


class ReduceProgram(_typing.NamedTuple):
    """A reduce set's steps on this rank and the buffers they use."""

    steps: list
    arena: Arena  # the fusion arena (private, or the node's segment)
    spans: list | None  # the segment's spans of the fused buckets, None when they go through MPI


class ReduceTransport(Transport[ReduceSet, ReducePlan]):
    """All-reduces with ``op`` on ``comm`` (mpisync's duplicate; any communicator of one rank),
    the fused buckets of up to ``fusion_bytes`` each on the node's segment once it pays (never,
    without ``segment``)."""

    name = MPI_NAME

    def __init__(self, comm, op: str, fusion_bytes: int, segment: bool = True):
        super().__init__(comm, 0)
        self.op, self.fusion = op, fusion_bytes
        self.segment: ReduceSegment | None = None
        self._segment_tried = not segment
        self._ring: TrackedRing | None = None  # the ring of the run in progress
        self._node_collectives = 0  # posted by the last run's reductions on the node's paths

    @property
    def nbytes(self) -> int:
        """Bytes of the node's segment, once open (the private arenas belong to programs)."""
        return self.segment.nbytes if self.segment is not None else 0

    def moves_to_segment(self, program: ReduceProgram) -> bool:
        """Whether a program on a private arena is to be compiled again onto the node's segment:
        the segment was never tried and the program's fused bytes suit it (the same answer on
        every rank)."""
        return self.comm.size > 1 and not self._segment_tried and self._fits(len(program.arena))

    def _fits(self, nbytes: int) -> bool:
        """Whether the policy sends ``nbytes`` of fused buckets through the node's segment."""
        chosen = _policy.choose(
            _policy.ALLREDUCE, nbytes, self.comm.size, _policy.BUCKETS, fusion_bytes=self.fusion
        )
        return chosen == SHARED

    def _segment_arena(self, nbytes: int, call):
        """``(arena, base)`` of this rank's region of the node's segment for ``nbytes`` of fused
        buckets, or None (a private arena, MPI). The segment is opened (collectively) at the first
        call whose fused bytes the policy sends there (:func:`~mpisync.transports.policy.choose`),
        the same call on every rank: the agreed manifests and
        ``fusion_bytes`` fix ``nbytes`` and the bounds."""
        if self.comm.size == 1 or not self._fits(nbytes):
            return None
        if not self._segment_tried:
            self._segment_tried = True
            self.segment = ReduceSegment.open(self.comm, nbytes, call)
        segment = self.segment
        # a larger set later: MPI, on every rank
        if segment is None or nbytes > segment.region_bytes:
            return None
        return segment.arena, segment.base

    def compile(self, columns: ReduceSet, plan: ReducePlan, fusion: int, ctx: Context):
        """The steps of ``plan`` over the set ``columns``, their fused buckets in a private arena
        or this rank's region of the node's segment (opened here, collectively, on the call where
        every rank decides to)."""
        arena, base = fused_arena(
            plan.arena_bytes, lambda nbytes: self._segment_arena(nbytes, ctx.call)
        )
        steps = columns.steps(plan, arena, base)
        segment = self.segment
        spans = segment.spans(steps) if segment is not None and arena is segment.arena else None
        return ReduceProgram(steps, arena, spans)

    def run(self, program: ReduceProgram, ctx: Context) -> None:
        """Reduce every step's buffer over the ranks (collective), then store it; counts the
        collectives into ``ctx.report``."""
        steps, spans, several = program.steps, program.spans, self.comm.size > 1
        ring = self._ring = TrackedRing(ctx.capacity, ctx.deadline.timeout, self.comm)
        ctx.pending = ring.pending_labels
        op = _ops.mpi_op(self.op)
        fused = [step for step in steps if step.fused] if spans is not None else ()
        self._node_collectives = 0
        crossed = self._reduce_large(steps, ctx) if several else set()
        mid = self._reduce_mid(steps, crossed, ctx) if several else set()
        for step in steps:
            if (fused and step.fused) or id(step) in crossed or id(step) in mid:
                continue  # through the segment, below, or done
            ring.make_room()
            if step.load is not None:
                step.load()
            if several:
                request = self.comm.Iallreduce(MPI.IN_PLACE, step.buffer, op)
                ring.push(request, step.store, step.label)
            elif step.store is not None:
                step.store()
        if spans is not None and fused:
            self._reduce_on_segment(fused, spans, ring, ctx)
        ring.drain()
        self._ring, ctx.pending = None, None
        report = ctx.report
        if several:
            done = len(fused) + len(crossed) + len(mid)
            report.collectives += len(steps) - done + (2 if fused else 0)
            report.collectives += self._node_collectives
        report.fused_buckets = sum(1 for s in steps if s.fused)
        report.transfers = len(steps)
        report.channel = SHARED if fused or mid else CROSS if crossed else MPI_NAME

    def _reduce_large(self, steps: list, ctx: Context) -> set:
        """Reduce by cross-memory, one dtype at a time, the direct steps (tensors reduced in their
        own memory) of each dtype whose bytes together the policy sends by cross-memory, where the
        node's path is open; the ids of the steps done. The plan is agreed, so every rank groups the
        same steps and posts the same collectives, before any of the ring's."""
        large = [g for g in _direct_groups(steps) if _crossing(_nbytes(g), self.comm.size)]
        if not large:
            return set()
        with _naming(large[0]):
            cross, posted = drive(opened(self.comm), ctx.call)
        self._node_collectives += posted
        if cross is None:
            return set()
        for group in large:
            with _naming(group):
                self._reduce_group(cross, group, ctx)
        return {id(step) for group in large for step in group}

    def _reduce_mid(self, steps: list, crossed: set, ctx: Context) -> set:
        """Reduce through the node's segment (:mod:`mpisync.transports.sharedreduce`), one dtype
        at a time, the direct steps of each dtype left to MPI that hold a mid size together; the
        ids of the steps done. The plan is agreed, so every rank groups the same steps."""
        done: set = set()
        for group in _direct_groups(steps, crossed):
            with _naming(group):
                path, posted = drive(shared_opened(self.comm, _nbytes(group)), ctx.call)
                self._node_collectives += posted
                if path is not None:
                    self._reduce_group(path, group, ctx)
                    done.update(id(step) for step in group)
        return done

    def _reduce_group(self, path, group: list, ctx: Context) -> None:
        """Load ``group``'s steps, reduce their buffers laid end to end by ``path``'s collective
        steps (cross-memory's or the node segment's), then store them."""
        for step in group:
            if step.load is not None:
                step.load()
        arrays = [step.buffer for step in group]
        steps = path.steps(self.comm, arrays, _ops.local_op(self.op))
        self._node_collectives += drive(steps, ctx.call)[1]
        for step in group:
            if step.store is not None:
                step.store()

    def _reduce_on_segment(self, fused: list, spans: list, ring: TrackedRing, ctx: Context) -> None:
        # The large tensors' all-reduces stay in flight meanwhile; the barriers come after them on
        # every rank (one order of collectives on the communicator).
        for step in fused:
            step.load()
        assert self.segment is not None  # spans are only made for its arena
        try:
            self.segment.reduce(self.comm, spans, self.op, ctx.call)
        except Expired as expired:
            expired.pending = [n for label in ring.pending_labels() for n in label] + [
                n for step in fused for n in step.label
            ]
            raise
        for step in fused:
            step.store()

    def close(self, broken: bool = False) -> None:
        """Let go of the segment; after a timeout (``broken``) keep it and the ring in flight
        alive, as collectives may still write into them."""
        if broken:
            keep_alive(self._ring, self.segment)
        self.segment, self._ring = None, None


@_contextlib.contextmanager
def _naming(group: list):
    """A wait that expires inside names ``group``'s tensors as the ones in flight (the node's
    paths post their collectives outside the ring, whose labels name the others')."""
    try:
        yield
    except Expired as expired:
        expired.pending = [n for step in group for n in step.label]
        raise


def _direct_groups(steps: list, done=()) -> list:
    """The direct steps (tensors reduced in their own memory) of ``steps`` not in ``done`` (ids),
    grouped by their buffers' dtype, in the order the dtypes first appear."""
    groups: dict = {}
    for step in steps:
        if not step.fused and id(step) not in done:
            groups.setdefault(step.buffer.dtype, []).append(step)
    return list(groups.values())


def _crossing(nbytes: int, ranks: int) -> bool:
    """Whether the policy reduces ``nbytes`` of tensors in their own memory by cross-memory."""
    return _policy.choose(_policy.ALLREDUCE, nbytes, ranks, _policy.LIST) == CROSS


def _nbytes(group: list) -> int:
    return sum(step.buffer.nbytes for step in group)
