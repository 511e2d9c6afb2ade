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

import collections.abc as _abc
import functools as _functools
import json as _json
import operator as _operator
import time as _time
import typing as _typing

from mpi4py import MPI

from .._runtime.clock import Deadline
from .._runtime.keepalive import keep_alive
from .._runtime.launch import check_launch
from .._runtime.lifecycle import Reusable
from .._runtime.ring import Expired, TrackedRing
from .._runtime.speedups import speedups as _speedups
from .._runtime.timeouts import timed_out
from ..errors import InvalidParamError, SyncError
from ..params.adapters import ArrayView
from ..params.agreement import agree, diagnose
from ..params.bulk import BulkManifest
from ..params.fanout import fan_out
from ..params.manifest import Manifest, Param, build_manifest
from ..params.recheck import Snapshot, unchanged
from ..plan.arena import Arena
from ..plan.prepared import keep_values
from ..plan.spans import host_layout
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
# less than the segment's two barriers (the crossover: docs/allreduce.md, stop 23).
_SEGMENT_MIN_BYTES = 24 << 10


def _check_comm(comm) -> None:
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise InvalidParamError(f"comm must be an mpi4py intracommunicator, got {comm!r}")
    if comm.Is_inter():
        raise InvalidParamError("comm is an intercommunicator; mpisync needs an intracommunicator")
    check_launch(comm)  # a world of one where the launcher started more


class _Plan(_typing.NamedTuple):
    """What one parameter set compiled to: its steps and the buffers they use."""

    staging: _Staging | None  # the device replicas' host buffers
    steps: list
    arena: Arena  # the fusion arena (private, or the node's segment)
    replicated: list  # parameters with several local replicas (reduced locally, then fanned out)
    spans: list | None  # the segment's spans of the fused buckets, None when they go through MPI


class _Prepared(_typing.NamedTuple):
    """A compiled set kept for the next call, and what recognises it."""

    values: tuple
    keys: tuple
    devices: object
    manifest: BulkManifest | Manifest
    plan: _Plan
    state: Snapshot | None  # of the values; None when not kept (replica lists)


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
        _check_comm(comm)
        rank, size = comm.rank, comm.size
        if size > 1 and self._comm is None and self._dup is None:
            self._dup = comm.Idup()  # overlaps this rank's manifest building
        prepared = self._match(params, devices)
        manifest = (
            prepared.manifest
            if prepared is not None
            else self._manifest(params, devices, rank, size)
        )
        timeout = self._values["timeout"]
        report = SyncReport(
            tensors=manifest.tensors,
            replicas=manifest.nreplicas,
            bytes=manifest.nbytes,
            collectives=0,
            seconds=0.0,
            transport="host" if size > 1 else "local",
            rank=rank,
            size=size,
        )
        phase, ring = "validation", None
        try:
            if size > 1:
                call = Deadline(timeout).wait  # each collective its own timeout, as in the ring
                if self._comm is None:
                    assert self._dup is not None  # started above, on the first call with size > 1
                    call(self._dup[1])
                    self._comm, self._dup = self._dup[0], None
                agree(self._comm, manifest, call)
                self._agreed += 1
                report.collectives += 1
                if prepared is not None and self._segment_due(prepared.plan.arena):
                    prepared = None  # on every rank: its fused buckets move onto the node's segment
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
            assert timeout is not None  # only a deadline expires
            timed_out(comm, f"all-reduce {phase}", pending, timeout)
        report.seconds = _time.perf_counter() - start
        return report

    def _manifest(self, params, devices, rank, size):
        settings = {
            "op": self._op if isinstance(self._op, str) else repr(self._op),
            "fusion_bytes": self._values["fusion_bytes"],
        }
        manifest: BulkManifest | Manifest | None
        if not self._settings_error:
            manifest = scan_for_reduce(
                params, self._op, rank=rank, size=size, devices=devices, settings=settings
            )
            if manifest is not None:
                return manifest
        manifest = build_manifest(
            params, rank=rank, size=size, root=0, devices=devices, settings=settings
        )
        if self._settings_error:
            manifest.errors.append((None, self._settings_error))
            return manifest
        for p in manifest.params:
            problem = _ops.check(p.master.dtype, self._op)
            if problem is None and not all(r.writable for r in p.replicas):
                problem = "a replica is read-only, but the all-reduce writes every replica"
            if problem:
                manifest.errors.append((p.name, problem))
        _note_shared_memory(manifest)
        return manifest

    def _match(self, params, devices):
        prepared = self._prepared
        if prepared is None or not isinstance(params, _abc.Mapping):
            return None
        values, keys, devices_key, _, _, state = prepared
        key = tuple(devices) if isinstance(devices, _abc.Sequence) else devices
        if key != devices_key:
            return None
        if _speedups is not None and type(params) is dict:
            if not _speedups.same_items(params, keys, values):
                return None
        elif tuple(params) != keys or not all(map(_operator.is_, params.values(), values)):
            return None
        # Each array still where, and as, it was compiled: ``resize(refcheck=False)`` moves a numpy
        # array's bytes (buffer exports do not stop it), ``tensor.data = other`` a tensor's.
        return prepared if unchanged(values, state) else None

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
        key = tuple(devices) if isinstance(devices, _abc.Sequence) else devices
        values, keys, state = keep_values(params, manifest)  # state None: replica lists, not kept
        prepared = _Prepared(values, keys, key, manifest, plan, state)
        if state is not None:  # a mapping of bare arrays: the same objects may come back
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
