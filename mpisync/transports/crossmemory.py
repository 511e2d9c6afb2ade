"""The ``cross-memory`` transport: tensors copied process to process
(:mod:`mpisync.transports.cma`);
a failed copy on any rank redoes the sync through MPI."""

from __future__ import annotations

import numpy as _np
from mpi4py import MPI

from .._runtime.observe import logger
from ..params.adapters import _byte_view
from ..params.bulk import BulkManifest
from ..params.fanout import copy_host, replica_copies
from ..plan.program import transfer_buffer
from .base import Context, Transport
from .cma import CrossMemory
from .mpi import MpiTransport
from .selection import CROSS


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
            direct = [
                _byte_view(values[i])[off : off + n] for fused, i, off, n in plan if not fused and n
            ]
            small = [
                _byte_view(values[i])
                for fused, first, last, _ in plan
                if fused
                for i in range(first, last)
                if sizes[i]
            ]
            return _CrossProgram(manifest, plan, fusion, direct, small, ())
        host = manifest.host_params
        direct = [b for b in (transfer_buffer(host, t) for t in plan if not t.fused) if len(b)]
        small = [
            host[i].master.data
            for t in plan
            if t.fused
            for i, _, _, _ in t.pieces
            if host[i].nbytes
        ]
        return _CrossProgram(
            manifest, plan, fusion, direct, small, replica_copies(host, range(len(host)))
        )

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
        steps = self.fallback.compile(program.manifest, program.plan, program.fusion, ctx)
        self.fallback.run(steps, ctx)

    def close(self, broken: bool = False) -> None:
        # a closed transport is not used again: the assignment ignore
        self.cross = None  # type: ignore[assignment]


class _CrossProgram:
    __slots__ = ("manifest", "plan", "fusion", "direct", "small", "fan_out", "copies")

    def __init__(self, manifest, plan, fusion, direct, small, fan_out):
        self.manifest, self.plan, self.fusion = manifest, plan, fusion
        self.direct, self.small, self.fan_out, self.copies = direct, small, fan_out, None
