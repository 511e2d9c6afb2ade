"""``GradSync`` and ``allreduce``: the gradient counterpart of the parameter sync.

Every replica of every name ends up holding the reduction over all replicas
on all ranks: replicas are combined into the master locally, masters are
all-reduced across ranks (fused buckets of small tensors, large tensors in
place, at most ``max_concurrent`` collectives in flight), then the result is
copied back to every replica. Validation, errors and timeouts are those of
:func:`mpisync.sync_params`: one all-reduce of a digest agrees that every
rank may start, or on the one error every rank raises.
"""

from __future__ import annotations

import functools as _functools
import json as _json
import time as _time
import typing as _typing

from mpi4py import MPI

from .._runtime.clock import Deadline
from .._runtime.keepalive import keep_alive
from .._runtime.lifecycle import Reusable, check_comm
from .._runtime.ring import Expired, TrackedRing
from .._runtime.timeouts import timed_out
from ..errors import SyncError
from ..params.adapters import ArrayView
from ..params.agreement import agree, diagnose
from ..params.bulk import BulkManifest
from ..params.fanout import fan_out
from ..params.layout import host_layout
from ..params.manifest import Manifest, Param, build_manifest
from ..plan.arena import Arena
from ..plan.prepared import Recognizer, devices_key_of, recognizer
from ..report import SyncReport
from ..transports.selection import SHARED
from . import ops as _ops
from .bulk import compile_bulk_steps, scan_for_reduce
from .plan import compile_steps, local_reduce, ordered
from .segment import ReduceSegment

__all__ = ["GradSync", "allreduce"]

# The most fused bytes the node's segment takes, in buckets: each rank's region holds them all, so
# the segment (ranks x regions) stays within what 16 buckets in flight per rank would hold.
_SEGMENT_BUCKETS = 16
# The fewest fused bytes the segment takes: below, one all-reduce of the bytes through MPI costs
# less than the segment's two barriers (the crossover: docs/allreduce.md).
_SEGMENT_MIN_BYTES = 24 << 10


class _Plan(_typing.NamedTuple):
    """What one parameter set compiled to: its steps and the buffers they use."""

    staging: _Staging | None  # the device replicas' host buffers
    steps: list
    arena: Arena  # the fusion arena (private, or the node's segment)
    replicated: list  # parameters with several local replicas (reduced locally, then fanned out)
    spans: list | None  # the segment's spans of the fused buckets, None when they go through MPI


class _Prepared(_typing.NamedTuple):
    """A compiled set kept for the next call, and what recognises it."""

    recognizer: Recognizer | None  # None when not kept (replica lists)
    manifest: BulkManifest | Manifest
    plan: _Plan


class _Staging:
    """Device replicas copied to host buffers before the reduction and back after it."""

    def __init__(self, params: list):
        self.params = params
        self.host = []  # per param: host ArrayViews over the pinned buffers, master first
        self.buffers = []  # per param: the pinned numpy buffers themselves
        for p in params:
            buffers = [p.master.backend.pinned(r.nbytes) for r in p.replicas]
            views = [
                ArrayView(memoryview(b).cast("B"), r.shape, r.dtype, True)
                for b, r in zip(buffers, p.replicas)
            ]
            self.host.append(Param(p.name, views))
            self.buffers.append(buffers)

    def _sync_all(self) -> None:
        for p in self.params:
            for r in p.replicas:
                r.backend.synchronize(r.device)

    def load(self) -> list:
        """Copy every device replica to its host buffer; return the host parameters."""
        self._sync_all()  # the producers of the device bytes are done
        for p, buffers in zip(self.params, self.buffers):
            for r, buffer in zip(p.replicas, buffers):
                r.backend.to_host(buffer, r.data, r.backend.stream(r.device))
        self._sync_all()
        return self.host

    def store(self) -> None:
        """Copy every reduced master back into every device replica, and wait for the copies."""
        for p, buffers in zip(self.params, self.buffers):
            for r in p.replicas:
                r.backend.to_device(r.data, buffers[0], r.backend.stream(r.device))
        self._sync_all()


class GradSync(Reusable):
    """A reusable all-reduce over ``comm`` (default ``MPI.COMM_WORLD``) with reduction ``op``
    (``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"prod"``).

    The first call duplicates ``comm``; later calls reuse it, and when the same
    arrays come back (same keys and objects, each still at the same address
    with the same shape, strides, dtype and writability) the validation and
    the compiled buckets too; every call still agrees with the other ranks on
    the manifest digest. ``close()`` frees everything.
    """

    def __init__(
        self,
        comm=None,
        *,
        op="sum",
        max_concurrent=None,
        fusion_bytes=None,
        gpu_transport=None,
        timeout=None,
    ):
        self._user_comm = MPI.COMM_WORLD if comm is None else comm
        self._op = op
        self._resolve_settings(max_concurrent, fusion_bytes, gpu_transport, timeout)
        if op not in _ops.OPS:
            self._settings_error = f"op must be one of {', '.join(map(repr, _ops.OPS))}, got {op!r}"
        self._comm: MPI.Intracomm | None = None
        self._dup: tuple[MPI.Intracomm, MPI.Request] | None = None
        self._prepared: _Prepared | None = None
        # the node's shared regions for fused buckets, once open
        self._segment: ReduceSegment | None = None
        self._segment_tried = False
        # Calls whose validation all-reduce agreed: the same count on every rank, whatever fails
        # after.
        self._agreed = 0
        self._closed = False
        self._broken: str | None = None

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host buffers this syncer holds between calls (fusion arena or shared
        segment)."""
        segment = self._segment.nbytes if self._segment is not None else 0
        plan = self._prepared.plan if self._prepared is not None else None
        return segment + (len(plan.arena) if plan is not None and plan.spans is None else 0)

    def close(self) -> None:
        """Free the duplicated communicator and cached buffers; further calls raise."""
        if self._comm is not None and self._broken is None:
            self._comm.Free()
        self._comm = None
        self._prepared = None
        self._segment = None
        self._closed = True

    def allreduce(self, params, *, devices=None) -> SyncReport:
        """Reduce every replica of every name over all ranks, in place (see
        :func:`mpisync.allreduce`)."""
        if self._closed:
            raise SyncError("mpisync: this GradSync is closed")
        if self._broken:
            raise SyncError(f"mpisync: this GradSync is unusable: {self._broken}")
        start = _time.perf_counter()
        comm = self._user_comm
        check_comm(comm)
        rank, size = comm.rank, comm.size
        if size > 1 and self._comm is None and self._dup is None:
            self._dup = comm.Idup()  # overlaps this rank's manifest building
        prepared = self._match(params, devices)
        manifest = (
            prepared.manifest
            if prepared is not None
            else _reduce_manifest(
                params,
                devices,
                rank,
                size,
                self._op,
                self._values["fusion_bytes"],
                self._settings_error,
            )
        )
        timeout = self._values["timeout"]
        report = SyncReport.of(
            manifest, rank=rank, size=size, transport="host" if size > 1 else "local"
        )
        phase, ring = "validation", None
        try:
            if size > 1:
                call = Deadline(timeout).wait  # each collective its own timeout, as in the ring
                prepared = self._agree(manifest, prepared, call)
                report.collectives += 1
            elif manifest.errors:
                raise diagnose([_json_doc(manifest)])
            if prepared is None:
                phase = "set-up"
                prepared = self._prepare(
                    params, devices, manifest, size, call if size > 1 else None
                )
            phase = "all-reduce"
            ring = TrackedRing(self._values["max_concurrent"], timeout)
            self._run(prepared, report, size, ring, call if size > 1 else None)
        except Expired as expired:
            self._timed_out(expired, phase, ring, prepared, manifest)
        report.seconds = _time.perf_counter() - start
        return report

    def _agree(self, manifest, prepared, call):
        """Wait for the duplicate (the first call), agree on the manifests (collective), and return
        the prepared set still to use: None when its fused buckets move onto the node's segment
        now (the same call on every rank)."""
        if self._comm is None:
            assert self._dup is not None  # posted on the first call with size > 1
            call(self._dup[1])
            self._comm, self._dup = self._dup[0], None
        agree(self._comm, manifest, call)
        self._agreed += 1
        if prepared is not None and self._segment_due(prepared.plan.arena):
            return None
        return prepared

    def _timed_out(self, expired, phase, ring, prepared, manifest) -> None:
        pending = getattr(expired, "pending", None)
        if pending is None:
            pending = (
                [n for label in ring.pending_labels() for n in label]
                if ring is not None
                else manifest.names
            )
        self._broken = (
            f"an all-reduce timed out during the {phase}; its collectives may still be pending"
        )
        # MPI may still write into the fusion and staging buffers: they outlive this object.
        keep_alive(ring, prepared, self._comm)
        timeout = self._values["timeout"]
        assert timeout is not None  # only a deadline expires
        timed_out(self._user_comm, f"all-reduce {phase}", pending, timeout)

    def _match(self, params, devices):
        """The prepared set when ``params`` holds exactly its arrays, each still as compiled (see
        :class:`mpisync.plan.prepared.Recognizer`), else None."""
        prepared = self._prepared
        key = devices_key_of(devices)
        if prepared is None or prepared.recognizer is None:
            return None
        return prepared if prepared.recognizer.matches(params, key) else None

    def _segment_due(self, arena) -> bool:
        """Whether a plan on the private ``arena`` is to be compiled again onto the node's segment:
        the segment was never tried, this is not the first agreed call, and the plan's fused bytes
        suit the segment."""
        return not self._segment_tried and self._agreed > 1 and self._segment_fits(len(arena))

    def _segment_fits(self, nbytes: int) -> bool:
        return _SEGMENT_MIN_BYTES <= nbytes <= _SEGMENT_BUCKETS * self._values["fusion_bytes"]

    def _fused_arena(self, nbytes: int, call):
        """``(arena, base)`` of this rank's region of the node's segment for ``nbytes`` of fused
        buckets, or None (a private arena, MPI). The first call goes through MPI: setting the
        segment up and touching its pages costs more than one all-reduce of the buckets
        (docs/allreduce.md), so a one-shot ``allreduce`` never opens it. The segment is opened
        (collectively) at the first later call whose fused bytes are at least ``_SEGMENT_MIN_BYTES``
        and fit in ``_SEGMENT_BUCKETS`` buckets, the same call on every rank: the agreed manifests
        and ``fusion_bytes`` fix ``nbytes`` and the bounds, and every rank counts the same agreed
        calls."""
        if call is None or self._agreed < 2 or not self._segment_fits(nbytes):
            return None
        if not self._segment_tried:
            self._segment_tried = True
            self._segment = ReduceSegment.open(self._comm, nbytes, call)
        segment = self._segment
        # a larger set later: MPI, on every rank
        if segment is None or nbytes > segment.region_bytes:
            return None
        return segment.arena, segment.base

    def _prepare(self, params, devices, manifest, size, call) -> _Prepared:
        arena_for = _functools.partial(self._fused_arena, call=call)
        fusion = self._values["fusion_bytes"]
        if isinstance(manifest, BulkManifest):
            staging, replicated = None, []
            steps, arena = compile_bulk_steps(manifest, self._op, fusion, size, arena_for)
        else:
            staging = _Staging(manifest.device_params) if manifest.device_params else None
            tied = {alias for alias, _ in manifest.settings.get("tied", ())}
            reduced = [p for p in manifest.host_params if p.name not in tied]
            reduced += staging.host if staging is not None else []
            replicated = [p for p in reduced if len(p.replicas) > 1]
            steps, arena = compile_steps(reduced, self._op, fusion, size, arena_for)
        if size > 1:
            steps = [ordered(step, self._op) for step in steps]
        spans = None
        if self._segment is not None and arena is self._segment.arena:
            spans = self._segment.spans(steps)
        plan = _Plan(staging, steps, arena, replicated, spans)
        key = devices_key_of(devices)
        kept = recognizer(params, manifest, key)  # None: replica lists, not kept
        prepared = _Prepared(kept, manifest, plan)
        if kept is not None:  # a mapping of bare arrays: the same objects may come back
            self._prepared = prepared
        return prepared

    def _run(self, prepared, report, size, ring, call) -> None:
        staging, steps, _arena, replicated, spans = prepared.plan
        if staging is not None:
            staging.load()
            report.transport = "staged"
        local_reduce(replicated, self._op)
        op = _ops.mpi_op(self._op)
        # duplicated at the validation whenever size > 1, the only case that uses it
        comm = _typing.cast(MPI.Intracomm, self._comm)
        fused = [step for step in steps if step.fused] if spans is not None else ()
        for step in steps:
            if fused and step.fused:
                continue  # through the segment, below
            ring.make_room()
            if step.load is not None:
                step.load()
            if size > 1:
                ring.push(comm.Iallreduce(MPI.IN_PLACE, step.buffer, op), step.store, step.label)
            elif step.store is not None:
                step.store()
        if fused:
            # The large tensors' all-reduces stay in flight meanwhile; the barriers come after them
            # on every rank (one order of collectives on the communicator).
            for step in fused:
                step.load()
            assert self._segment is not None  # spans are only made for its arena
            try:
                self._segment.reduce(comm, spans, self._op, call)
            except Expired as expired:
                expired.pending = [n for label in ring.pending_labels() for n in label] + [
                    n for step in fused for n in step.label
                ]
                raise
            for step in fused:
                step.store()
        ring.drain()
        fan_out(replicated)
        if staging is not None:
            staging.store()
        report.collectives += (len(steps) - len(fused) + (2 if fused else 0)) if size > 1 else 0
        report.fused_buckets = sum(1 for s in steps if s.fused)
        if fused:
            report.channel = SHARED
        report.transfers = len(steps)


def _reduce_manifest(params, devices, rank, size, op, fusion_bytes, settings_error):
    """The manifest of an all-reduce with ``op``: the bulk scan where it applies, else the general
    one with the reduction's own checks (dtype and op, writable replicas, shared memory)."""
    settings = {
        "op": op if isinstance(op, str) else repr(op),
        "fusion_bytes": fusion_bytes,
    }
    manifest: BulkManifest | Manifest | None
    if not settings_error:
        manifest = scan_for_reduce(
            params, op, rank=rank, size=size, devices=devices, settings=settings
        )
        if manifest is not None:
            return manifest
    manifest = build_manifest(
        params, rank=rank, size=size, root=0, devices=devices, settings=settings
    )
    if settings_error:
        manifest.errors.append((None, settings_error))
        return manifest
    for p in manifest.params:
        problem = _ops.check(p.master.dtype, op)
        if problem is None and not all(r.writable for r in p.replicas):
            problem = "a replica is read-only, but the all-reduce writes every replica"
        if problem:
            manifest.errors.append((p.name, problem))
    _note_shared_memory(manifest)
    return manifest


def _note_shared_memory(manifest) -> None:
    """Names that share memory (tied weights) are reduced once: the later names of each region go
    into the settings every rank compares (``tied``: ``[alias, representative]`` pairs), so every
    rank leaves out the same ones, or every rank raises. Memory two names share only in part, or
    a tie between names of several replicas or of different dtypes, is an error."""
    host = manifest.host_params
    layout = host_layout(host)
    tied = []
    for index, first in layout.aliases:
        alias, representative = host[index], host[first]
        if len(alias.replicas) > 1 or len(representative.replicas) > 1:
            problem = "has several replicas"
        elif alias.master.dtype != representative.master.dtype:
            problem = f"is {alias.master.dtype} there, {representative.master.dtype} here"
        else:
            tied.append([alias.name, representative.name])
            continue
        manifest.errors.append(
            (
                alias.name,
                f"shares its memory with {representative.name!r} and {problem}: "
                "tied parameters are reduced once, as one array of one replica",
            )
        )
    for index, other in layout.overlaps:
        manifest.errors.append(
            (
                host[index].name,
                f"overlaps {host[other].name!r} in memory without being the same "
                "array: the all-reduce would combine the shared bytes twice",
            )
        )
    if tied:
        manifest.settings["tied"] = tied


def _json_doc(manifest) -> dict:
    return _json.loads(manifest.encode())


def allreduce(
    params,
    comm=None,
    *,
    op="sum",
    devices=None,
    max_concurrent=None,
    fusion_bytes=None,
    gpu_transport=None,
    timeout=None,
) -> SyncReport:
    """Reduce, in place, every replica of every name over all replicas on all ranks of ``comm``.

    ``params`` maps each name to one array, a sequence of replicas, or a
    mapping of device key to replica, as for :func:`mpisync.sync_params`;
    ``op`` is ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"prod"``. Every
    rank raises the same :class:`~mpisync.SyncError` when any rank's input is
    bad. See :class:`GradSync` for the reusable form.
    """
    with GradSync(
        comm,
        op=op,
        max_concurrent=max_concurrent,
        fusion_bytes=fusion_bytes,
        gpu_transport=gpu_transport,
        timeout=timeout,
    ) as syncer:
        return syncer.allreduce(params, devices=devices)
