"""``GradSync`` and ``allreduce``: the gradient counterpart of the parameter sync.

Every replica of every name ends up holding the reduction over all replicas
on all ranks: replicas are combined into the master locally, masters are
all-reduced across ranks (fused buckets of small tensors, large tensors in
place, at most ``max_concurrent`` collectives in flight), then the result is
copied back to every replica. Validation, errors and timeouts are those of
:func:`mpisync.sync_params`: one all-reduce of a digest agrees that every
rank may start, or on the one error every rank raises.

A name that maps to ``None`` (a frozen or unused layer's ``p.grad``) is skipped and stays
``None``, as DDP skips unused parameters; the names skipped are part of what the ranks agree on,
so a name that is ``None`` on some ranks and an array on others is the same
:class:`~mpisync.ManifestMismatchError` on every rank (pass zeros there, as
``mpisync.horovod.DistributedOptimizer`` does).
"""

from __future__ import annotations

import functools as _functools
import json as _json
import operator as _operator
import time as _time
import typing as _typing
from collections.abc import Mapping, Sequence

from mpi4py import MPI

from .._runtime.clock import Deadline, Trace
from .._runtime.keepalive import keep_alive
from .._runtime.lifecycle import (
    Reusable,
    check_comm,
    duplicate,
    free_comm,
    interrupted,
    release_when_collected,
    settled,
    wait_duplicate,
)
from .._runtime.observe import Timeline, timeline_for
from .._runtime.ring import Expired
from .._runtime.timeouts import timed_out
from ..errors import SyncError
from ..params.agreement import NO_GRADIENT, agree, diagnose
from ..params.bulk import BulkManifest
from ..params.layout import host_layout
from ..params.manifest import Manifest, build_manifest
from ..plan.prepared import Recognizer, devices_key_of, matching, recognizer
from ..report import SyncReport
from ..transports.base import Context, pending_names
from . import ops as _ops
from .bulk import scan_for_reduce
from .reduceset import ReduceSet
from .transport import ReduceProgram, ReduceTransport

__all__ = ["GradSync", "allreduce"]


class _Prepared(_typing.NamedTuple):
    """A compiled set kept for the next call, and what recognises it."""

    recognizer: Recognizer | None  # None when not kept (replica lists)
    manifest: BulkManifest | Manifest
    reduced: ReduceSet
    program: ReduceProgram


class _Holdings:
    """What a :class:`GradSync` holds between calls: mpisync's duplicate of the communicator (or
    its ``Idup`` in flight), the transport and the kept program. Released together by
    ``close()``, or once the object is collected; a broken object's are kept instead (MPI may
    still write into them). Nothing here refers to the object, so dropping it releases them at
    once."""

    def __init__(self) -> None:
        self.comm: MPI.Intracomm | None = None
        # (communicator, request) of an Idup posted and not yet waited for
        self.dup: tuple[MPI.Intracomm, MPI.Request] | None = None
        self.prepared: _Prepared | None = None
        # on mpisync's duplicate of ``comm`` (with one rank: ``comm`` itself, never used)
        self.transport: ReduceTransport | None = None
        # why the object is unusable: a call ended with its collectives possibly still pending
        self.broken: str | None = None

    def release(self) -> None:
        """Free everything (not collective); a broken object's buffers are kept out of use."""
        broken = self.broken is not None
        if self.transport is not None:
            self.transport.close(broken=broken)
        if broken:
            keep_alive(self.prepared, self.transport, self.comm, self.dup)
        else:
            keep_alive(self.dup)  # posted by a call that raised before waiting for it
            free_comm(self.comm)  # the node paths it holds as attributes go with it
        self.comm = self.dup = self.prepared = self.transport = None


class GradSync(Reusable):
    """A reusable all-reduce over ``comm``: the form to call at every step.

    The first :meth:`allreduce` duplicates ``comm``; later calls reuse it, and
    when the same arrays come back (same keys and objects, each still at the
    same address with the same shape, strides, dtype and writability) the
    validation and the compiled buckets too; every call still agrees with the
    other ranks on the manifest digest. :meth:`close` (or leaving a ``with``
    block) frees everything. Nothing collective happens at construction, and
    nothing is raised there: an invalid ``op`` or setting is reported by the
    first :meth:`allreduce`, on every rank.

    Args:
        comm: The intracommunicator whose ranks take part (default ``MPI.COMM_WORLD``).
        op: The reduction: ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"prod"``.
        max_concurrent: The most collectives in flight at once (``MPISYNC_MAX_CONCURRENT``).
        fusion_bytes: Tensors smaller than this are packed into shared buffers of at most this
            size; ``0`` turns fusion off (``MPISYNC_FUSION_BYTES``).
        gpu_transport: ``"auto"``, ``"cuda-aware"`` or ``"staged"``
            (``MPISYNC_GPU_TRANSPORT``).
        timeout: Seconds each collective may take, the validation exchange included
            (``MPISYNC_TIMEOUT``).

    Example::

        with mpisync.GradSync(MPI.COMM_WORLD, op="avg") as reducer:
            for batch in data:
                loss(model(batch)).backward()
                reducer.allreduce({n: p.grad for n, p in model.named_parameters()})
                optimizer.step()
    """

    def __init__(
        self,
        comm: MPI.Intracomm | None = None,
        *,
        op: str = "sum",
        max_concurrent: int | None = None,
        fusion_bytes: int | None = None,
        gpu_transport: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self._op = op
        self._hold(comm, max_concurrent, fusion_bytes, gpu_transport, timeout)
        if op not in _ops.OPS:
            self._settings_error = f"op must be one of {', '.join(map(repr, _ops.OPS))}, got {op!r}"
        self._held = held = _Holdings()
        # close(), or the object collected without it: frees the duplicate and the buffers
        self._release = release_when_collected(self, held.release)
        self._closed = False
        self._timeline: Timeline | None = None  # MPISYNC_TIMELINE's, read at the first call
        self._begun = False  # the first call passed the communicator's check

    @property
    def _comm(self) -> MPI.Intracomm | None:
        return self._held.comm

    @property
    def _prepared(self) -> _Prepared | None:
        return self._held.prepared

    @property
    def _transport(self) -> ReduceTransport | None:
        return self._held.transport

    @property
    def _broken(self) -> str | None:
        return self._held.broken

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host buffers this syncer holds between calls (its fusion arena)."""
        program = self._prepared.program if self._prepared is not None else None
        return len(program.arena) if program is not None else 0

    def close(self) -> None:
        """Free the duplicated communicator and cached buffers; further calls raise.

        Not collective: each rank closes its own. Closing twice is harmless; an object
        dropped without ``close()`` is closed when it is collected. After a call that did not
        finish (timed out, or interrupted by any exception while its collectives were in
        flight) the buffers are kept alive but never used again.
        """
        self._closed = True
        self._release()

    def allreduce(
        self, params: Mapping[str, _typing.Any], *, devices: Sequence[_typing.Any] | None = None
    ) -> SyncReport:
        """Reduce every replica of every name over all replicas on all ranks, in place.

        Collective: every rank of the communicator calls it with parameter sets
        of the same names, shapes, dtypes and replica counts. A name that maps to
        ``None`` on every rank (a frozen or unused layer's ``p.grad``) is skipped
        and stays ``None``.

        Args:
            params: Each name maps to its replicas (one array, a sequence of arrays, or a mapping
                of device key to array), as for :func:`mpisync.sync_params`; every replica must
                be writable.
            devices: For mapping replicas: the device keys in order, the master's first.

        Returns:
            This rank's account of the call (tensors, replicas, bytes, collectives, seconds,
            transport).

        Raises:
            InvalidParamError: On every rank, when any rank passes an unsupported object or
                layout, a read-only replica, a dtype ``op`` cannot reduce, an invalid ``op`` or
                setting, or names that overlap in memory.
            ManifestMismatchError: On every rank, when the ranks' names, shapes, dtypes, replica
                counts, settings or ``None`` names differ.
            SyncTimeoutError: A collective did not complete within ``timeout``; by default the job
                is aborted after the diagnostic (``MPISYNC_TIMEOUT_ABORT=0`` raises instead).
            PeerExitedError: A rank of the communicator ended its script while others waited.
            SyncError: This object is closed, or unusable after a call that did not finish (timed
                out, or interrupted while its collectives were in flight), or MPI could not
                duplicate ``comm`` (communicator context ids used up).
        """
        phase = ["validation"]  # where an exception found the call
        try:
            return self._allreduce(params, devices, phase)
        except BaseException as exc:
            # Anything but an agreed refusal may leave collectives in flight: keep what they use,
            # and refuse every later call before it posts anything that could match them.
            if not settled(exc):
                reason = interrupted(exc, "an all-reduce", phase[0])
                if self._held.broken is None:
                    self._held.broken = reason
            raise

    def _allreduce(self, params, devices, where: list) -> SyncReport:
        held = self._held
        if self._closed:
            raise SyncError("mpisync: this GradSync is closed")
        if self._broken:
            raise SyncError(f"mpisync: this GradSync is unusable: {self._broken}")
        start = _time.perf_counter()
        if not self._begun:  # the first call: the communicator's check, MPISYNC_TIMELINE
            check_comm(self._user_comm)  # in a world of one it reads the launcher's environment
            self._timeline, self._begun = timeline_for(MPI.COMM_WORLD.rank), True
        timeline = self._timeline
        begin = timeline.now() if timeline is not None else 0
        comm = self._user_comm
        rank, size = comm.rank, comm.size
        if size > 1 and held.comm is None and held.dup is None:
            held.dup = duplicate(comm)  # overlaps this rank's manifest building
        params, skipped = without_none(params)
        prepared = matching(held.prepared, params, devices_key_of(devices))
        if prepared is not None and prepared.manifest.settings.get(NO_GRADIENT, []) != skipped:
            prepared = None
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
                {**self._wire, NO_GRADIENT: skipped} if skipped else self._wire,
            )
        )
        report = SyncReport.of(
            manifest, rank=rank, size=size, transport="host" if size > 1 else "local"
        )
        # each collective its own timeout, as in the ring
        deadline = Deadline(self._values["timeout"], comm=self._user_comm)
        phase, ctx = "validation", None
        try:
            prepared, ctx = self._agree(manifest, prepared, deadline, report)
            if prepared is None:
                phase = where[0] = "set-up"
                prepared = self._prepare(params, devices, manifest, ctx)
            phase = where[0] = "collectives"
            if prepared.reduced.before():
                report.transport = "staged"
            self._transport_of(ctx).run(prepared.program, ctx)
            prepared.reduced.after()
        except Expired as expired:
            self._timed_out(pending_names(expired, ctx, manifest.names), phase, prepared)
        report.seconds = _time.perf_counter() - start
        if timeline is not None:  # one span per call, whatever the number of tensors
            timeline.span(
                "allreduce", begin, tensors=report.tensors, bytes=report.bytes, op=self._op
            )
        return report

    def _agree(self, manifest, prepared, deadline, report) -> tuple:
        """``(prepared, ctx)``: with several ranks, wait for the duplicate (the first call) and
        agree on the manifests (collective). Alone, raise this rank's errors."""
        comm, held = self._user_comm, self._held
        if comm.size > 1:
            if held.comm is None:
                assert held.dup is not None  # posted on the first call with size > 1
                dup, held.dup = held.dup, None
                held.comm = wait_duplicate(dup, deadline.wait)
            comm = held.comm
            agree(comm, manifest, deadline.wait)
            report.collectives += 1
        elif manifest.errors:
            raise diagnose([_json_doc(manifest)])
        if held.transport is None:
            fusion = self._values["fusion_bytes"]
            held.transport = ReduceTransport(comm, self._op, fusion)
        ctx = Context(comm, 0, deadline, report, Trace(), self._values["max_concurrent"], False)
        return prepared, ctx

    def _transport_of(self, ctx) -> ReduceTransport:
        transport = self._held.transport
        assert transport is not None and transport.comm is ctx.comm  # made at _agree
        return transport

    def _timed_out(self, pending: list, phase: str, prepared) -> None:
        held = self._held
        held.broken = (
            f"an all-reduce timed out during the {phase}; its collectives may still be pending"
        )
        # MPI may still write into the fusion and staging buffers: they outlive this object.
        keep_alive(prepared, held.comm)
        if held.transport is not None:
            held.transport.close(broken=True)
        timed_out(self._user_comm, f"all-reduce {phase}", pending, self._values["timeout"])

    def _prepare(self, params, devices, manifest, ctx) -> _Prepared:
        reduced = ReduceSet(manifest, self._op, ctx.comm.size)
        fusion = self._values["fusion_bytes"]
        program = self._transport_of(ctx).compile(reduced, reduced.plan(fusion), fusion, ctx)
        kept = recognizer(params, manifest, devices_key_of(devices))  # None: replica lists
        prepared = _Prepared(kept, manifest, reduced, program)
        if kept is not None:  # a mapping of bare arrays: the same objects may come back
            self._held.prepared = prepared
        return prepared


_is_none = _functools.partial(_operator.is_, None)


def without_none(params) -> tuple:
    """``(params, [])``, or where a mapping holds ``None`` values, ``(a dict without them, their
    names, sorted)``: what :meth:`GradSync.allreduce` reduces and what it skips."""
    if not isinstance(params, Mapping):
        return params, []
    try:
        if not any(map(_is_none, params.values())):
            return params, []
        items = list(params.items())
    except Exception:  # noqa: BLE001 - reading params fails again, as an agreed error
        return params, []
    skipped = sorted(str(name) for name, value in items if value is None)
    return {name: value for name, value in items if value is not None}, skipped


def _reduce_manifest(params, devices, rank, size, op, fusion_bytes, settings_error, wire):
    """The manifest of an all-reduce with ``op``: the bulk scan where it applies, else the general
    one with the reduction's own checks (dtype and op, writable replicas, shared memory between
    replicas)."""
    settings = {
        "op": op if isinstance(op, str) else repr(op),
        "fusion_bytes": fusion_bytes,
        **wire,
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
    params: Mapping[str, _typing.Any],
    comm: MPI.Intracomm | None = None,
    *,
    op: str = "sum",
    devices: Sequence[_typing.Any] | None = None,
    max_concurrent: int | None = None,
    fusion_bytes: int | None = None,
    gpu_transport: str | None = None,
    timeout: float | None = None,
) -> SyncReport:
    """Reduce, in place, every replica of every name over all replicas on all ranks of ``comm``.

    Collective over ``comm``; the one-shot form of :class:`GradSync`. Every
    replica of every name ends up holding the reduction; names are processed
    in ``sorted()`` order. A name that maps to ``None`` on every rank is
    skipped. Settings left ``None`` come from the ``MPISYNC_*`` environment
    variables, else built-in defaults.

    Args:
        params: Each name maps to its replicas: one array, a sequence of arrays, or a mapping of
            device key to array, as for :func:`mpisync.sync_params`; every replica must be
            writable.
        comm: The intracommunicator whose ranks take part (default ``MPI.COMM_WORLD``).
        op: The reduction: ``"sum"``, ``"avg"``, ``"min"``, ``"max"`` or ``"prod"``.
        devices: For mapping replicas: the device keys in order, the master's first.
        max_concurrent: The most collectives in flight at once (``MPISYNC_MAX_CONCURRENT``).
        fusion_bytes: Tensors smaller than this are packed into shared buffers of at most this
            size; ``0`` turns fusion off (``MPISYNC_FUSION_BYTES``).
        gpu_transport: ``"auto"``, ``"cuda-aware"`` or ``"staged"`` (``MPISYNC_GPU_TRANSPORT``).
        timeout: Seconds each collective may take, the validation exchange included
            (``MPISYNC_TIMEOUT``).

    Returns:
        This rank's account of the call (tensors, replicas, bytes, collectives, seconds,
        transport).

    Raises:
        InvalidParamError: On every rank, when any rank passes an unsupported object or layout, a
            read-only replica, a dtype ``op`` cannot reduce, an invalid ``op`` or setting, or
            names that overlap in memory.
        ManifestMismatchError: On every rank, when the ranks' names, shapes, dtypes, replica
            counts, settings or ``None`` names differ.
        SyncTimeoutError: A collective did not complete within ``timeout``; by default the job is
            aborted after the diagnostic (``MPISYNC_TIMEOUT_ABORT=0`` raises instead).
        PeerExitedError: A rank of ``comm`` ended its script while others waited.

    Example::

        mpisync.allreduce({n: p.grad for n, p in model.named_parameters()}, op="avg")
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
