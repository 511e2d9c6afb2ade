"""``ParamSync`` and ``sync_params``: validate -> plan -> move -> fan out -> verify.

Each step is a module: :mod:`~mpisync.plan.prepared` and :mod:`~mpisync.params.manifest`
(what this rank holds), :mod:`~mpisync.params.agreement` (one all-reduce), the plan over the
host masters' columns (:mod:`~mpisync.params.columns`, :mod:`~mpisync.plan.transfers`), a
transport chosen by
:mod:`~mpisync.transports.selection` (:mod:`~mpisync.transports.base`,
:mod:`~mpisync.transports.device`),
and :mod:`~mpisync.params.verify`. The replicas' fan-out runs inside each program,
after the bytes of a transfer arrived.
"""

from __future__ import annotations

import gc as _gc
import json as _json
import logging as _logging
import time as _time
from collections.abc import Mapping, Sequence
from typing import Any

from mpi4py import MPI

from ._runtime.clock import Deadline, Trace
from ._runtime.keepalive import keep_alive
from ._runtime.lifecycle import (
    Reusable,
    check_comm,
    duplicate,
    free_comm,
    interrupted,
    release_when_collected,
    settled,
    wait_duplicate,
)
from ._runtime.observe import configure_logging, logger, timeline_for
from ._runtime.ring import Expired
from ._runtime.timeouts import timed_out
from .config import SettingValues
from .errors import SyncError
from .params.agreement import agree, diagnose
from .params.fanout import fan_out
from .params.layout import NO_RUNS
from .params.verify import verify as _verify
from .plan.prepared import (
    Prepared,
    all_smaller,
    devices_key_of,
    find_manifest,
    recognizer,
)
from .plan.transfers import DEFAULT_CHUNK_BYTES, fused_count
from .report import SyncReport
from .transports.base import Context, host_plan, pending_names
from .transports.device import DeviceTransport
from .transports.device_pipeline import DEFAULT_DEVICE_CHUNK_BYTES
from .transports.host import HostTransports
from .transports.selection import CROSS, FactsExchange
from .transports.selection import MPI as MPI_CHANNEL

__all__ = ["ParamSync", "sync_params"]


def _sync_alone(manifest, report, verify, trace, t_validate, device) -> None:
    """One rank: no peers, only the local fan-out (and verification of it)."""
    if manifest.errors:
        raise diagnose([_json.loads(manifest.encode())])
    trace.span("validate", t_validate, tensors=manifest.tensors)
    t_fan_out = trace.now()
    if manifest.nreplicas > manifest.tensors:  # some name has replicas to fill
        fan_out(manifest.host_params)
    if manifest.device_params:
        device.fan_out_local(manifest.device_columns)
    trace.span("fan-out", t_fan_out, replicas=manifest.nreplicas - manifest.tensors)
    if verify:
        _verify_on(None, manifest, 0, None, trace, device)
    report.transport, report.verified = "local", bool(verify)


def _verify_on(comm, manifest, root, call, trace, device) -> None:
    start = trace.now()
    _verify(comm, manifest, root, call, device.to_host if manifest.device_params else None)
    trace.span("verify", start, tensors=manifest.tensors)


def _layout_of(manifest, prepared):
    """This rank's memory layout of the host masters: kept with a prepared set."""
    return prepared.layout if prepared is not None else manifest.host_layout()


class _Link:
    """mpisync's duplicate of the caller's communicator (so its traffic never matches the
    caller's) and the facts all-reduce the choice of transport needs: both posted before this rank
    builds its manifest, so their round trips overlap that work, and waited for under the sync's
    deadline."""

    def __init__(self, user_comm, host: HostTransports):
        self.user, self.host = user_comm, host
        self.comm: MPI.Intracomm | None = None
        # (communicator, request) of an Idup posted and not yet waited for
        self._dup: tuple[MPI.Intracomm, MPI.Request] | None = None
        # the facts all-reduce in flight, until waited for
        self._facts: FactsExchange | None = None

    def post(self) -> None:
        """Post the duplication (and, the first time, the facts all-reduce), once."""
        if self.comm is None and self._dup is None:
            self._dup = duplicate(self.user)
            if self.host.facts is None:
                # Posted on the caller's communicator right after the Idup, in the same order on
                # every rank.
                self._facts = self.host.post_facts(self.user)

    def ready(self, call) -> MPI.Intracomm:
        """The duplicate, once it and the facts are complete (each waited for with ``call``)."""
        if self.comm is None:
            self.post()
            assert self._dup is not None  # posted just now, or before
            dup, self._dup = self._dup, None
            try:
                self.comm = wait_duplicate(dup, call)
            except SyncError:  # on every rank; the facts, posted after the Idup, still complete
                self._facts_ready(call)
                raise
        self._facts_ready(call)
        return self.comm

    def _facts_ready(self, call) -> None:
        if self._facts is not None:
            self.host.facts, self._facts = self._facts.result(call), None

    def close(self, broken: bool) -> None:
        """Free the duplicate; after a call that did not finish (``broken``) keep what may still
        be pending."""
        if broken:  # requests still pending may write into these
            keep_alive(self._facts, self._dup, self.comm)
        else:
            # posted by a sync that raised an agreed error before waiting for them
            keep_alive(self._facts, self._dup)
            free_comm(self.comm)
        self.comm = self._dup = self._facts = None


class _Compiler:
    """A syncer's programs: the channel each set takes (set up on first use, collectively) and the
    program compiled for it, reused while the same arrays come back under the same agreed layout
    and channel."""

    def __init__(self, host: HostTransports, device, values: SettingValues):
        self.host, self.device = host, device  # device(): the syncer's DeviceTransport
        self.fusion = values["fusion_bytes"]
        self.chunk_bytes = DEFAULT_CHUNK_BYTES
        self.one_shot = False  # sync_params: one sync, nothing to recognise later

    def ready(self, params, devices_key, manifest, prepared, layout, agreed, ctx) -> tuple:
        """``(prepared, reused)`` for ``manifest`` under the ``agreed`` layout; completes ``ctx``
        with whether every rank is on one node."""
        if prepared is not None:
            small, host_bytes = prepared.small, prepared.host_bytes
        else:
            small, host_bytes = all_smaller(manifest, self.fusion), manifest.host_nbytes
        channel = self.host.choose(ctx.comm, small, ctx.call) if host_bytes else MPI_CHANNEL
        assert self.host.facts is not None  # exchanged by the link
        ctx.one_node = self.host.facts.one_node
        if prepared is not None and prepared.agreed == agreed and prepared.channel == channel:
            return prepared, True
        fusion = manifest.settings["fusion_bytes"]
        plan: list = []
        program: object = ()
        if host_bytes:
            columns = manifest.host_columns(agreed, fusion)
            plan = host_plan(columns, fusion, self.chunk_bytes)
            program = self.host.get(channel).compile(columns, plan, fusion, ctx)
        device_steps = (
            self.device().compile(manifest.device_columns) if manifest.device_params else []
        )
        prepared = Prepared(
            recognizer=None if self.one_shot else recognizer(params, manifest, devices_key),
            manifest=manifest,
            layout=layout,
            agreed=agreed,
            channel=channel,
            program=program,
            fused_buckets=fused_count(plan),
            transfers=len(plan),
            device_steps=device_steps,
            host_bytes=host_bytes,
            small=small,
        )
        return prepared, False


class _Collective:
    """The part of a sync with peers, once this rank's manifest is built: the duplicate, the
    agreement, the program (compiled or reused) and its binding, the move and the verification.
    :attr:`phase` and :attr:`ctx` say where a timeout found it."""

    def __init__(self, link: _Link, compiler: _Compiler, device, root: int, values, keep):
        self.link, self.compiler, self.root, self.values = link, compiler, root, values
        self.device = device  # device(): the syncer's DeviceTransport
        self.keep = keep  # keep(prepared): the program to reuse (None: nothing to recognise)
        self.phase = "communicator duplication"
        self.ctx: Context | None = None

    def run(
        self, params, devices_key, manifest, prepared, report, verify, trace, t_validate
    ) -> None:
        """Sync ``manifest``'s set with the other ranks, each collective under the syncer's
        timeout; hands the program to ``keep`` as soon as it is ready."""
        values = self.values
        deadline = Deadline(values["timeout"], report, self.link.user)
        self.phase, self.ctx = "communicator duplication", None
        comm = self.link.ready(deadline.wait)
        self.phase = "validation exchange"
        layout = _layout_of(manifest, prepared)
        same_layout, anyone_fresh = agree(
            comm, manifest, deadline.wait, layout.digest, prepared is None
        )
        agreed = layout if same_layout else NO_RUNS
        self.phase = "transport set-up"
        self.ctx = ctx = Context(
            comm, self.root, deadline, report, trace, values["max_concurrent"], False
        )
        prepared, reused = self.compiler.ready(
            params, devices_key, manifest, prepared, layout, agreed, ctx
        )
        self.keep(prepared if prepared.recognizer is not None else None)
        transport = self.compiler.host.get(prepared.channel) if prepared.host_bytes else None
        if transport is not None and (anyone_fresh or not reused):
            # Peers copy to and from this rank's arrays: every rank binds again when any rank
            # prepared.
            self.phase = "address exchange"
            transport.bind(prepared.program, ctx)
        trace.span("validate", t_validate, tensors=manifest.tensors, reused=reused)
        self._move(prepared, transport, ctx, report, trace)
        if verify:
            self.phase = "verification"
            _verify_on(comm, manifest, self.root, deadline.wait, trace, self.device())
            report.verified = True

    def _move(self, prepared, transport, ctx, report, trace) -> None:
        """Run the host program, then the device steps: root's bytes into every replica."""
        report.fused_buckets, report.transfers, report.channel = (
            prepared.fused_buckets,
            prepared.transfers,
            prepared.channel,
        )
        self.phase = "cross-memory copies" if prepared.channel == CROSS else "broadcast"
        if transport is not None:
            transport.run(prepared.program, ctx)
        if prepared.device_steps:
            self.phase = "device broadcast"
            report.transport = self.device().run(
                self.link.comm,
                self.root,
                prepared.device_steps,
                self.values["gpu_transport"],
                self.values["timeout"],
                report,
                trace,
            )


class _Holdings:
    """What a :class:`ParamSync` holds between syncs: its duplicate (the link), host transports,
    device transport and kept program. Released together by ``close()``, or once the syncer is
    collected; a broken syncer's are kept instead (MPI may still write into them). Nothing here
    refers to the syncer, so dropping it releases them at once."""

    def __init__(self, link: _Link, host: HostTransports, values: SettingValues):
        self.link, self.host, self.values = link, host, values
        self.device_chunk_bytes = DEFAULT_DEVICE_CHUNK_BYTES
        self.device: DeviceTransport | None = None
        self.prepared: Prepared | None = None
        # why the syncer is unusable: a call ended with its collectives possibly still pending
        self.broken: str | None = None

    def device_transport(self) -> DeviceTransport:
        """The device transport, made on first use."""
        if self.device is None:
            self.device = DeviceTransport(
                self.values["max_concurrent"],
                self.values["fusion_bytes"],
                self.device_chunk_bytes,
            )
        return self.device

    def keep(self, prepared: Prepared | None) -> None:
        """Keep ``prepared`` for the next sync (``None``: nothing to recognise)."""
        self.prepared = prepared

    def release(self) -> None:
        """Free everything (not collective); a broken syncer's buffers are kept out of use."""
        broken = self.broken is not None
        self.link.close(broken)
        if broken:
            keep_alive(self.prepared)
        self.prepared = None
        self.host.close(broken)
        if self.device is not None:
            if broken:  # its pinned and device buffers stay out of the allocators' reach
                keep_alive(self.device)
            else:
                self.device.close()
        self.device = None


class ParamSync(Reusable):
    """A reusable parameter sync over ``comm``: the form to call again and again.

    The first :meth:`sync` duplicates ``comm`` (so mpisync's traffic never
    matches the caller's) and decides, the same way on every rank, how host
    bytes move; later syncs reuse the communicator, the transport and its
    buffers. When a mapping of bare arrays comes back with the same array
    objects, each still at the same address with the same shape, strides,
    dtype and writability, its validation and compiled copies are reused too;
    every sync still agrees with the other ranks on the manifest digest.
    :meth:`close` (or leaving a ``with`` block) frees everything.

    Nothing collective happens at construction, and nothing is raised there:
    an invalid setting or ``root`` is reported by the first :meth:`sync`, on
    every rank, like any bad input. Settings left ``None`` come from the
    ``MPISYNC_*`` environment variables, else built-in defaults
    (``mpisync info`` shows each and its source).

    Args:
        comm: The intracommunicator whose ranks take part (default ``MPI.COMM_WORLD``).
        root: The rank of ``comm`` whose master replicas every other replica receives.
        max_concurrent: The most collectives in flight at once (``MPISYNC_MAX_CONCURRENT``).
        fusion_bytes: Tensors smaller than this are packed into shared buffers of at most this
            size; ``0`` turns fusion off (``MPISYNC_FUSION_BYTES``).
        gpu_transport: ``"auto"`` (CUDA-aware MPI only when positively detected, else host
            staging), ``"cuda-aware"`` or ``"staged"`` (``MPISYNC_GPU_TRANSPORT``).
        timeout: Seconds every collective of a sync may take, the validation exchange included
            (``MPISYNC_TIMEOUT``).

    Example::

        with mpisync.ParamSync(MPI.COMM_WORLD, root=0) as syncer:
            syncer.sync(model.state_dict())
    """

    def __init__(
        self,
        comm: MPI.Intracomm | None = None,
        *,
        root: int = 0,
        max_concurrent: int | None = None,
        fusion_bytes: int | None = None,
        gpu_transport: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self._hold(comm, max_concurrent, fusion_bytes, gpu_transport, timeout)
        self._root = root
        self._host = HostTransports(root)
        self._link = _Link(self._user_comm, self._host)
        self._held = held = _Holdings(self._link, self._host, self._values)
        self._compiler = _Compiler(self._host, held.device_transport, self._values)
        self._collective = _Collective(
            self._link, self._compiler, held.device_transport, root, self._values, held.keep
        )
        self._closed = False
        # close(), or the syncer collected without it: frees the duplicate and the buffers
        self._release = release_when_collected(self, held.release)
        # (rank, size, trace) of the caller's communicator, once it passed the check
        self._where: tuple[int, int, Trace] | None = None

    @property
    def _prepared(self) -> Prepared | None:
        return self._held.prepared

    @property
    def _device(self) -> DeviceTransport | None:
        return self._held.device

    @property
    def _broken(self) -> str | None:
        return self._held.broken

    @property
    def _device_chunk_bytes(self) -> int:
        return self._held.device_chunk_bytes

    @_device_chunk_bytes.setter
    def _device_chunk_bytes(self, nbytes: int) -> None:
        # For tests: every rank sets the same value before the first sync.
        self._held.device_chunk_bytes = nbytes

    def _prefer(self, channel: str) -> None:
        # For the bench and tests: host bytes take ``channel`` wherever every rank can use it.
        self._host.preferred = channel

    @property
    def last_choice(self) -> Any:
        """How host bytes moved in the last sync and why (an internal record whose ``str()`` says
        it), or ``None`` before the first sync between ranks."""
        return self._host.last_choice

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host buffers this syncer holds between syncs (fusion arena); device
        staging is not counted."""
        return self._host.nbytes

    @property
    def _mapped_bytes(self) -> int:
        # For the bench's memory row: buffers tracemalloc does not see (an arena on a file).
        return self._host.nbytes - self._host.traced_bytes

    def close(self) -> None:
        """Free the duplicated communicator and the cached buffers; further syncs raise.

        Not collective: each rank closes its own. After a sync that did not finish
        (timed out, or interrupted by any exception while its collectives were in
        flight) the buffers are kept alive but never used again: collectives still
        pending may write into them. Closing twice is harmless; a syncer dropped
        without ``close()`` is closed when it is collected.
        """
        self._closed = True
        self._release()

    def sync(
        self,
        params: Mapping[str, Any],
        *,
        devices: Sequence[Any] | None = None,
        verify: bool = False,
    ) -> SyncReport:
        """Make every replica on every rank byte-for-byte equal to root's master replica.

        Collective: every rank of the communicator calls it, with parameter sets
        of the same names, shapes, dtypes and replica counts (in any insertion
        order: names are processed in ``sorted()`` order).

        Args:
            params: Each name maps to its replicas: one array, a sequence of arrays, or a mapping
                of device key to array (numpy, torch CPU or CUDA, CuPy, or anything with the
                buffer protocol or DLPack; C-contiguous, writable on receiving ranks). The master
                replica is the first one (for a mapping, the one under ``devices[0]`` when
                ``devices`` is given).
            devices: For mapping replicas: the device keys in order, the master's first.
            verify: After the sync, check with a digest that every rank holds root's bytes.

        Returns:
            This rank's account of the sync (tensors, replicas, bytes, collectives, seconds,
            transport).

        Raises:
            InvalidParamError: Bad input on any rank, raised on every rank (the cases
                :func:`sync_params` lists).
            ManifestMismatchError: The ranks' sets or settings differ (on every rank).
            SyncTimeoutError: A rank never called ``sync`` within ``timeout`` (by default the
                job is aborted after the diagnostic; ``MPISYNC_TIMEOUT_ABORT=0`` raises).
            PeerExitedError: A rank of the communicator ended its script while others waited.
            VerificationError: ``verify=True`` found a rank whose bytes differ from root's.
            SyncError: This syncer is closed, or unusable after a sync that did not finish (timed
                out, or interrupted while its collectives were in flight), or MPI could not
                duplicate ``comm`` (communicator context ids used up).
        """
        # A cold sync creates a few objects per tensor and no reference cycles; left on, the
        # cyclic collector walks the whole heap several times meanwhile.
        collecting = _gc.isenabled()
        _gc.disable()
        try:
            return self._sync(params, devices, verify)
        except BaseException as exc:
            self._interrupted(exc, self._collective.phase)
            raise
        finally:
            if collecting:
                _gc.enable()

    def _interrupted(self, exc: BaseException, phase: str) -> None:
        # Anything but an agreed refusal may leave collectives in flight: keep what they use, and
        # refuse every later call before it posts anything that could match them.
        if not settled(exc):
            reason = interrupted(exc, "a sync", phase)
            if self._held.broken is None:
                self._held.broken = reason

    def _sync(self, params, devices, verify) -> SyncReport:
        if self._closed:
            raise SyncError("mpisync: this ParamSync is closed")
        if self._broken:
            raise SyncError(f"mpisync: this ParamSync is unusable: {self._broken}")
        start = _time.perf_counter()
        self._collective.phase = "validation"
        if self._where is None:  # until the caller's communicator passes the check
            comm = self._user_comm
            check_comm(comm)
            # MPISYNC_TIMELINE is read once per syncer, not per sync: every lookup would add to a
            # repeated sync's fixed cost (docs/performance.md; `mpisync bench` times it).
            self._where = (comm.rank, comm.size, Trace(timeline_for(comm.rank)))
        rank, size, trace = self._where
        if size > 1:
            self._link.post()
        configure_logging(rank)
        t_validate = trace.now()
        agreed = {
            "fusion_bytes": self._values["fusion_bytes"],
            "chunk_bytes": self._compiler.chunk_bytes,
            "device_chunk_bytes": self._device_chunk_bytes,
            "verify": bool(verify),
            "root": self._root,
            **self._wire,
        }
        devices_key = devices_key_of(devices)
        manifest, prepared = find_manifest(
            params,
            devices,
            devices_key,
            self._prepared,
            rank=rank,
            size=size,
            root=self._root,
            settings=agreed,
            settings_error=self._settings_error,
        )
        report = SyncReport.of(manifest, rank=rank, size=size, root=self._root)
        if size == 1:
            _sync_alone(manifest, report, verify, trace, t_validate, self._held.device_transport())
        else:
            self._sync_collective(
                params, devices_key, manifest, prepared, report, verify, trace, t_validate
            )
        report.seconds = _time.perf_counter() - start
        trace.flush()
        if logger.isEnabledFor(_logging.INFO):
            logger.info(report.summary())
        return report

    @property
    def _device_slots(self):
        # For tests/transports/test_device.py: the device transport's staging slots, once made.
        return self._device._slots if self._device is not None else None

    def _sync_collective(
        self, params, devices_key, manifest, prepared, report, verify, trace, t_validate
    ):
        collective = self._collective
        try:
            collective.run(
                params, devices_key, manifest, prepared, report, verify, trace, t_validate
            )
        except Expired as expired:
            pending = pending_names(expired, collective.ctx, manifest.names)
            self._timed_out(collective.phase, pending, self._values["timeout"])

    def _collective_exchange(self, phase: str, pending: list, exchange):
        """Run ``exchange(comm, call)`` on the library's communicator under this sync's timeout.

        For collectives outside the parameter broadcast (``sync_state``'s
        structure and scalar exchange); a timeout is handled like any other.
        """
        if self._closed or self._broken:
            raise SyncError("mpisync: this ParamSync is closed or unusable")
        deadline = Deadline(self._settings.timeout.value, comm=self._user_comm)
        try:
            return exchange(self._link.ready(deadline.wait), deadline.wait)
        except Expired:
            self._timed_out(phase, pending, deadline.timeout)
        except BaseException as exc:
            self._interrupted(exc, phase)
            raise

    def _timed_out(self, phase: str, pending: list, timeout: float | None) -> None:
        self._held.broken = (
            f"a sync timed out during the {phase}; its collectives may still be pending"
        )
        what = "pending parameter(s)"
        timed_out(self._user_comm, phase, pending, timeout, pending_what=what, call="sync")


def sync_params(
    params: Mapping[str, Any],
    comm: MPI.Intracomm | None = None,
    *,
    root: int = 0,
    devices: Sequence[Any] | None = None,
    max_concurrent: int | None = None,
    fusion_bytes: int | None = None,
    gpu_transport: str | None = None,
    timeout: float | None = None,
    verify: bool = False,
) -> SyncReport:
    """Broadcast every parameter from ``root``'s master replica to every replica on every rank.

    Collective over ``comm``; the one-shot form of :class:`ParamSync` (both use the
    same transports). Names are processed in ``sorted()`` order, so the
    mapping's insertion order may differ between ranks. With one process
    (``comm.size == 1``) only the local fan-out to the other replicas runs.
    Settings left ``None`` come from the ``MPISYNC_*`` environment variables,
    else built-in defaults.

    Args:
        params: Each name maps to its replicas: one array, a sequence of arrays, or a mapping of
            device key to array (numpy, torch CPU or CUDA, CuPy, or anything with the buffer
            protocol or DLPack; any fixed-size dtype; C-contiguous, writable on receiving ranks).
            All replicas of a name share shape and dtype.
        comm: The intracommunicator whose ranks take part (default ``MPI.COMM_WORLD``).
        root: The rank of ``comm`` whose master replicas every other replica receives.
        devices: For mapping replicas: the device keys in order; the master is under
            ``devices[0]`` (default: the mapping's first key).
        max_concurrent: As for :class:`ParamSync`: the most collectives in flight.
        fusion_bytes: As for :class:`ParamSync`: the size of the buffers small tensors share.
        gpu_transport: As for :class:`ParamSync`: how GPU buffers travel.
        timeout: As for :class:`ParamSync`: seconds each collective of the call may take.
        verify: After the sync, check with a digest that every rank holds root's bytes.

    Returns:
        This rank's account of the sync (tensors, replicas, bytes, collectives, seconds,
        transport).

    Raises:
        InvalidParamError: On every rank, when any rank passes an unsupported object, a
            non-contiguous array, a read-only array on a receiving rank, replicas that disagree in
            shape or dtype, an invalid setting, or a ``root`` out of range; also a world of one
            process where the launcher started more.
        ManifestMismatchError: On every rank, when the ranks' names, shapes, dtypes, replica
            counts or settings differ.
        SyncTimeoutError: A collective did not complete within ``timeout`` (a rank that never
            calls ``sync_params``); the diagnostic goes to stderr and, by default, the job is
            aborted (``MPISYNC_TIMEOUT_ABORT=0`` raises instead).
        PeerExitedError: A rank of ``comm`` ended its script while others waited.
        VerificationError: ``verify=True`` found a rank whose bytes differ from root's.

    Example::

        report = mpisync.sync_params(model.state_dict(), MPI.COMM_WORLD, root=0)
        print(report.summary())
    """
    syncer = ParamSync(
        comm,
        root=root,
        max_concurrent=max_concurrent,
        fusion_bytes=fusion_bytes,
        gpu_transport=gpu_transport,
        timeout=timeout,
    )
    syncer._compiler.one_shot = syncer._host.one_shot = True  # used once: nothing kept for later
    with syncer:
        return syncer.sync(params, devices=devices, verify=verify)
