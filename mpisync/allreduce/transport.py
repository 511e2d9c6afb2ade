"""The all-reduce's transport: a reduce set's collectives behind the interface of the broadcast
transports (:class:`mpisync.transports.base.Transport`).

Every step is an ``Iallreduce`` through the request ring (at most ``capacity`` in flight), large
tensors in place in their own memory. On one node the tensors reduced in their own memory go by
cross-memory (:mod:`mpisync.transports.crossreduce`), one dtype at a time, from the size
:mod:`mpisync.transports.policy` gives. The path is chosen from the first call on, by sizes
alone: a path that changed after some calls would sum in another order, and a call repeated on
the same inputs must give the same bytes.
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
from ..transports.policy import CROSS
from ..transports.policy import MPI as MPI_NAME
from . import ops as _ops
from .plan import ReducePlan, fused_arena
from .reduceset import ReduceSet

__all__ = ["ReduceProgram", "ReduceTransport"]


class ReduceProgram(_typing.NamedTuple):
    """A reduce set's steps on this rank and the buffers they use."""

    steps: list
    arena: Arena  # the fusion arena


class ReduceTransport(Transport[ReduceSet, ReducePlan]):
    """All-reduces with ``op`` on ``comm`` (mpisync's duplicate; any communicator of one rank),
    the fused buckets of up to ``fusion_bytes`` each."""

    name = MPI_NAME

    def __init__(self, comm, op: str, fusion_bytes: int):
        super().__init__(comm, 0)
        self.op, self.fusion = op, fusion_bytes
        self._ring: TrackedRing | None = None  # the ring of the run in progress
        self._node_collectives = 0  # posted by the last run's reductions by cross-memory

    @property
    def nbytes(self) -> int:
        """Bytes held between calls (none: the arenas belong to programs)."""
        return 0

    def compile(self, columns: ReduceSet, plan: ReducePlan, fusion: int, ctx: Context):
        """The steps of ``plan`` over the set ``columns``, their fused buckets in a private
        arena."""
        arena = fused_arena(plan.arena_bytes)
        return ReduceProgram(columns.steps(plan, arena), arena)

    def run(self, program: ReduceProgram, ctx: Context) -> None:
        """Reduce every step's buffer over the ranks (collective), then store it; counts the
        collectives into ``ctx.report``."""
        steps, several = program.steps, self.comm.size > 1
        ring = self._ring = TrackedRing(ctx.capacity, ctx.deadline.timeout, self.comm)
        ctx.pending = ring.pending_labels
        op = _ops.mpi_op(self.op)
        self._node_collectives = 0
        crossed = self._reduce_large(steps, ctx) if several else set()
        for step in steps:
            if id(step) in crossed:
                continue  # done
            ring.make_room()
            if step.load is not None:
                step.load()
            if several:
                request = self.comm.Iallreduce(MPI.IN_PLACE, step.buffer, op)
                ring.push(request, step.store, step.label)
            elif step.store is not None:
                step.store()
        ring.drain()
        self._ring, ctx.pending = None, None
        report = ctx.report
        if several:
            report.collectives += len(steps) - len(crossed) + self._node_collectives
        report.fused_buckets = sum(1 for s in steps if s.fused)
        report.transfers = len(steps)
        report.channel = CROSS if crossed else MPI_NAME

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

    def _reduce_group(self, path, group: list, ctx: Context) -> None:
        """Load ``group``'s steps, reduce their buffers laid end to end by ``path``'s collective
        steps (cross-memory's), then store them."""
        for step in group:
            if step.load is not None:
                step.load()
        arrays = [step.buffer for step in group]
        steps = path.steps(self.comm, arrays, _ops.local_op(self.op))
        self._node_collectives += drive(steps, ctx.call)[1]
        for step in group:
            if step.store is not None:
                step.store()

    def close(self, broken: bool = False) -> None:
        """Let go of the ring; after a timeout (``broken``) keep it alive, as the collectives in
        flight may still write into their buffers."""
        if broken:
            keep_alive(self._ring)
        self._ring = None


@_contextlib.contextmanager
def _naming(group: list):
    """A wait that expires inside names ``group``'s tensors as the ones in flight (the node's
    paths post their collectives outside the ring, whose labels name the others')."""
    try:
        yield
    except Expired as expired:
        expired.pending = [n for step in group for n in step.label]
        raise


def _direct_groups(steps: list) -> list:
    """The direct steps (tensors reduced in their own memory) of ``steps``, grouped by their
    buffers' dtype, in the order the dtypes first appear."""
    groups: dict = {}
    for step in steps:
        if not step.fused:
            groups.setdefault(step.buffer.dtype, []).append(step)
    return list(groups.values())


def _crossing(nbytes: int, ranks: int) -> bool:
    """Whether the policy reduces ``nbytes`` of tensors in their own memory by cross-memory."""
    return _policy.choose(_policy.ALLREDUCE, nbytes, ranks, _policy.LIST) == CROSS


def _nbytes(group: list) -> int:
    return sum(step.buffer.nbytes for step in group)
