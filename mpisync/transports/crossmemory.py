"""The ``cross-memory`` transport: tensors copied process to process
(:mod:`mpisync.transports.cma`);
a failed copy on any rank redoes the sync through MPI."""

from __future__ import annotations

import numpy as _np
from mpi4py import MPI

from .._runtime.observe import logger
from ..params.columns import HostColumns
from ..params.fanout import copy_host
from .base import Context, Transport
from .cma import CrossMemory
from .mpi import MpiTransport
from .selection import CROSS


class CrossTransport(Transport[HostColumns, list]):
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

    def compile(self, columns, plan: list, fusion: int, ctx: Context):
        # Every rank's lists must have the same lengths (bind all-gathers them with one count):
        # what the plan moves no bytes for is left out.
        sizes = columns.sizes
        direct = [columns.view(i)[off : off + n] for fused, i, off, n in plan if not fused and n]
        small = [
            columns.view(i)
            for fused, first, last, _ in plan
            if fused
            for i in range(first, last)
            if sizes[i]
        ]
        fan_out = columns.fan_out(range(len(columns)))
        return _CrossProgram(columns, plan, fusion, direct, small, fan_out)

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
        ctx.call(
            self.comm.Iallreduce(
                _np.array([int(bool(copied))], dtype=_np.int64), everyone, op=MPI.MIN
            )
        )
        if everyone[0]:
            begin = timeline.now()
            copy_host(program.fan_out)
            timeline.span("fan-out", begin, copies=len(program.fan_out))
            logger.debug(
                "cross-memory: %d direct transfers and %d small tensors copied process to process",
                len(program.direct),
                len(program.small),
            )
            timeline.span("broadcast", started, channel="cross-memory")
            return
        logger.warning(
            "rank %d: cross-memory copies failed on some rank; every rank redoes them through MPI "
            "now and keeps MPI",
            self.comm.rank,
        )
        self.failed = True
        steps = self.fallback.compile(program.columns, program.plan, program.fusion, ctx)
        self.fallback.run(steps, ctx)

    def close(self, broken: bool = False) -> None:
        # a closed transport is not used again: the assignment ignore
        self.cross = None  # type: ignore[assignment]


class _CrossProgram:
    __slots__ = ("columns", "plan", "fusion", "direct", "small", "fan_out", "copies")

    def __init__(self, columns, plan, fusion, direct, small, fan_out):
        self.columns, self.plan, self.fusion = columns, plan, fusion
        self.direct, self.small, self.fan_out, self.copies = direct, small, fan_out, None
