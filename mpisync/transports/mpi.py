"""The ``mpi`` transport: nonblocking broadcasts through the request ring, small tensors packed
into the fusion buckets of an arena."""

from __future__ import annotations

import functools as _functools
import logging as _logging

from .._runtime.keepalive import keep_alive
from .._runtime.observe import logger
from .._runtime.ring import TrackedRing
from .._runtime.speedups import compiled_lists
from ..params.columns import HostColumns
from ..plan.arena import Arena
from ..plan.program import compile_program, fused_slots
from ..plan.transfers import fused_count
from .base import Context, Transport, names_of
from .selection import MPI as MPI_NAME


class MpiTransport(Transport[HostColumns, list]):
    """Nonblocking broadcasts through the request ring; small tensors packed in an arena's
    buckets."""

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
        self.arena = Arena(needed, vectored=False if compiled_lists else None)
        return True

    def compile(self, columns, plan: list, fusion: int, ctx: Context):
        self._ensure_arena(fused_slots(ctx.capacity, fused_count(plan), ctx.one_node) * fusion)
        return compile_program(
            columns, plan, receiving=self.receiving, arena=self.arena, fusion_bytes=fusion
        )

    def run(self, program, ctx: Context) -> None:
        comm, root, timeline = self.comm, self.root, ctx.timeline
        ring = TrackedRing(ctx.capacity, ctx.deadline.timeout, comm)
        ctx.pending = ring.pending_labels
        debug = logger.isEnabledFor(_logging.DEBUG)
        start = timeline.now()
        for k, step in enumerate(program):
            ring.make_room()
            if step.after >= 0:  # the bucket that used this arena slot before is done and unpacked
                ring.retire_through(step.after)
            step.start(timeline.active)
            if debug:
                logger.debug(
                    "Ibcast %d/%d: %d bytes from root %d, %s: %s",
                    k + 1,
                    len(program),
                    len(step.buffer[0]),
                    root,
                    "fused" if step.fused else "direct",
                    names_of(step.label),
                )
            request = comm.Ibcast(step.buffer, root)
            if not (step.unpack or step.fan_out):
                done = None
            elif timeline.active is not None:
                done = _functools.partial(step.finish, timeline.active)
            else:
                done = step.finish
            ring.push(request, done, step.label)
        ring.drain()
        ctx.pending = None
        timeline.span(
            "broadcast",
            start,
            collectives=len(program),
            bytes=sum(len(s.buffer[0]) for s in program),
        )
        ctx.report.collectives += len(program)

    def close(self, broken: bool = False) -> None:
        if broken:
            keep_alive(self.arena)
        self.arena = Arena(0)
