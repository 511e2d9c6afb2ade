"""``ParamSync`` and ``sync_params``: validate, broadcast in a capped ring, fan out, verify."""

from __future__ import annotations

import collections.abc as _abc
import dataclasses as _dc
import functools as _functools
import gc as _gc
import json as _json
import logging as _logging
import operator as _operator
import sys as _sys
import time as _time
from typing import Any, Mapping, Sequence

import numpy as _np
from mpi4py import MPI

from . import config as _config
from .agreement import agree, diagnose
from .bulk import BulkManifest, bulk_plan, compile_bulk, scan
from .errors import InvalidParamError, SyncError, SyncTimeoutError
from .channels import CROSS_CHANNEL, MPI_CHANNEL, SHARED_CHANNEL, ChannelTrial
from .crossmemory import CrossMemory, host_word
from .intranode import SLOT_BYTES, SMALL_SLOTS, NodeSegment, compile_chunks, setting as segment_setting
from .layout import NO_RUNS, Layout, host_layout
from .manifest import build_manifest, replica_copies
from .observe import configure_logging, logger, timeline_for
from .plan import DEFAULT_CHUNK_BYTES, build_plan
from .arena import Arena
from .program import arena_slots, compile_program, fused_slots, transfer_buffer
from .report import SyncReport
from .speedups import speedups as _speedups
from .ring import Expired, TrackedRing, wait_request
from .staged import DEFAULT_DEVICE_CHUNK_BYTES, DeviceSlots, compile_device_steps, device_to_host, run_device_steps
from .verify import verify as _verify

__all__ = ["ParamSync", "sync_params"]

# Seconds between writing a timeout diagnostic and aborting, so the launcher
# forwards the message before it tears the job down.
_ABORT_GRACE_SECONDS = 1.0
_PLAN_CACHE_SIZE = 8


def _check_comm(comm):
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise InvalidParamError(f"comm must be an mpi4py intracommunicator, got {comm!r}")
    if comm.Is_inter():
        raise InvalidParamError("comm is an intercommunicator; mpisync needs an intracommunicator")


@_dc.dataclass
class _Prepared:
    """A validated manifest and its compiled steps, reusable while the same arrays come back."""

    values: tuple  # the arrays prepared, compared by identity (held, so never recycled)
    keys: tuple
    devices: object
    torch_indices: tuple
    torch_storage: tuple
    manifest: object
    layout: Layout  # this rank's runs of parameters end to end in memory
    runs: tuple  # the runs the steps send as spans: layout.runs when every rank's layout agreed, else ()
    channel: str  # how host bytes move: steps (MPI), steps and copies (cross-memory), chunks (shared segment)
    steps: list
    chunks: list
    fused_buckets: int
    transfers: int  # host plan steps; device steps are added when they run
    device_steps: list
    host_bytes: int
    cross: tuple = ()  # cross-memory: (direct transfer buffers, fused tensors' masters, fan-out pairs)
    small: bool = False  # every host tensor smaller than fusion_bytes (see ParamSync._channels)
    copies: object = None  # cross-memory: this rank's copies (crossmemory.Copies), bound to every rank's
    version: tuple = (None, -1)  # (the dict last matched, its version tag): see matches

    def matches(self, params, devices) -> bool:
        """Whether ``params`` holds exactly the arrays (and, for torch, the storage) prepared."""
        if devices != self.devices:
            return False
        if _speedups is not None and type(params) is dict:
            # The dict's version tag is unchanged only if no entry changed: then the walk over
            # its entries (60 us for 5000 with cold caches) is skipped.
            version = _speedups.dict_version(params)
            if version == -1 or version != self.version[1] or params is not self.version[0]:
                if not _speedups.same_items(params, self.keys, self.values):
                    return False
                self.version = (params, version)
        elif tuple(params) != self.keys or not all(map(_operator.is_, params.values(), self.values)):
            return False
        return not self.torch_indices or _torch_storage(tuple(params.values()), self.torch_indices) == self.torch_storage


# sync_params' syncer lives for one sync, and the arena it frees would come back to the next call
# as fresh pages: first touches cost about 6 us a page here (back to back, a cold sync_params of
# 5000 x 400 B took 1.5-1.8 ms with a new 512 KiB arena, 1.0-1.15 ms with the last call's). So a
# one-shot syncer hands its arena on to the next: one spare, of 2 x fusion_bytes at the defaults.
_spare_arenas: list = []


def _take_spare_arena():
    try:
        return _spare_arenas.pop()
    except IndexError:  # none, or another thread took it
        return None


def _all_smaller(manifest, fusion_bytes: int, bulk: bool) -> bool:
    """Whether every host tensor of ``manifest`` is smaller than ``fusion_bytes`` (there is one at least)."""
    if bulk:
        return bool(len(manifest.sizes)) and int(manifest.sizes.max()) < fusion_bytes
    host = manifest.host_params
    return bool(host) and all(p.nbytes < fusion_bytes for p in host)


def _torch_storage(values: tuple, indices: tuple) -> tuple:
    # ``tensor.data = other`` keeps the object but moves its bytes: check where they are.
    return tuple((values[i].data_ptr(), values[i].shape) for i in indices)


class ParamSync:
    """A reusable parameter sync over ``comm`` (default ``MPI.COMM_WORLD``).

    The first ``sync`` duplicates ``comm`` (so mpisync's traffic never matches
    the caller's); later syncs reuse that communicator, the broadcast plan and
    the fusion buffers. When a mapping of bare arrays comes back with the same
    keys and the same array objects (torch: the same storage), its validation
    and compiled copies are reused too; every sync still agrees with the other
    ranks on the manifest digest. ``close()`` frees everything.
    Settings left ``None`` come from ``MPISYNC_*`` environment variables, else
    built-in defaults (see ``mpisync info``).
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, root: int = 0, max_concurrent: int | None = None,
                 fusion_bytes: int | None = None, gpu_transport: str | None = None,
                 timeout: float | None = None) -> None:
        self._user_comm = MPI.COMM_WORLD if comm is None else comm
        self._root = root
        # A bad setting is reported at sync time, collectively, like any bad input.
        self._settings_error = None
        try:
            self._settings = _config.resolve(max_concurrent, fusion_bytes, gpu_transport, timeout)
        except InvalidParamError as exc:
            self._settings_error = str(exc)
            self._settings = _config.resolve(1, 0, "auto", _config.BUILTIN_DEFAULTS["timeout"])
        self._values = self._settings.values()  # read-only: the settings are fixed for the syncer's life
        self._chunk_bytes = DEFAULT_CHUNK_BYTES
        self._device_chunk_bytes = DEFAULT_DEVICE_CHUNK_BYTES
        self._device_slots = None
        self._comm = None
        self._dup = None  # (communicator, request) of an Idup posted and not yet waited for
        self._plans: dict = {}
        self._arena = Arena(0)
        self._prepared = None
        self._node = None  # the node's shared segment: None until tried, False if unavailable or slower
        self._cross = None  # cross-memory copies: None until tried, False if unavailable, slower or failed
        self._cross_memory = None  # None: MPISYNC_CROSS_MEMORY decides
        self._copy_us = 0  # this rank's cross-memory copies in the last sync, sent with the next validation
        self._trial = ChannelTrial()
        # The node's shared segment: True for every set (MPISYNC_SHARED_MEMORY=1, or _prefer), False never
        # (=0), None (unset) for sets of small tensors only (see _channels).
        self._shared_memory = segment_setting()
        self._small = False  # whether the last sync's host tensors were all smaller than fusion_bytes
        self._closed = False
        self._broken = None
        self._one_shot = False  # sync_params: one sync, then close
        self._where = None  # (rank, size, timeline) of the caller's communicator, once it passed the check
        self._host = 0  # this rank's node, as a word of the validation all-reduce (crossmemory.host_word)
        self._one_node = False  # whether the last validation found every rank on one node

    def _prefer(self, channel: str) -> None:
        # For the bench and tests: skip the channel trial; host bytes take ``channel`` from the first
        # sync on where every rank can use it, else MPI (as if ``channel`` had won the trial).
        self._trial.prefer(channel, (MPI_CHANNEL, CROSS_CHANNEL, SHARED_CHANNEL))
        if channel == SHARED_CHANNEL:
            self._shared_memory = True  # as with MPISYNC_SHARED_MEMORY=1

    @property
    def buffer_bytes(self) -> int:
        """Bytes of host buffers this syncer holds between syncs: the fusion arena, or the slots
        (and their counters) of the node's shared segment; device staging is not counted."""
        node = self._node.nbytes if self._node else 0
        return len(self._arena) + node

    @property
    def _mapped_bytes(self) -> int:
        # For the bench's memory row: the buffers tracemalloc does not see (memory mappings: the node's
        # segment, an arena on a memory file); a plain-memory arena is traced like any numpy array.
        return self.buffer_bytes - (0 if self._arena.mapped else len(self._arena))

    @property
    def settings(self) -> _config.Settings:
        """The effective settings and where each came from."""
        return self._settings

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self) -> None:
        """Free the duplicated communicator and the cached buffers; further syncs raise."""
        if self._comm is not None and self._broken is None:
            self._comm.Free()
        self._comm = None
        self._plans.clear()
        self._prepared = None
        if self._one_shot and len(self._arena) and not _spare_arenas:
            _spare_arenas.append(self._arena)  # for the next sync_params call (see _take_spare_arena)
        self._arena = Arena(0)
        self._node = None
        self._cross = None
        self._device_slots = None
        self._closed = True

    def sync(self, params: Mapping[str, Any], *, devices: Sequence[Any] | None = None,
             verify: bool = False) -> SyncReport:
        """Make every replica on every rank byte-for-byte equal to root's master replica.

        Every rank of the communicator must call this with parameter sets of the
        same names, shapes, dtypes and replica counts; otherwise every rank
        raises the same :class:`~mpisync.SyncError` and nothing is written.
        """
        # A cold sync creates a few objects per tensor and no reference cycles; left
        # on, the cyclic collector walks the whole heap several times meanwhile
        # (about 40% of a cold sync of 5000 tensors).
        collecting = _gc.isenabled()
        _gc.disable()
        try:
            return self._sync(params, devices, verify)
        finally:
            if collecting:
                _gc.enable()

    def _sync(self, params, devices, verify) -> SyncReport:
        if self._closed:
            raise SyncError("mpisync: this ParamSync is closed")
        if self._broken:
            raise SyncError(f"mpisync: this ParamSync is unusable: {self._broken}")
        start = _time.perf_counter()
        where = self._where
        if where is None:  # the first sync (or every one until the caller's communicator passes the check)
            comm = self._user_comm
            _check_comm(comm)
            # MPISYNC_TIMELINE is read once per syncer: the lookup alone costs 10 us of a repeated sync.
            where = self._where = (comm.rank, comm.size, timeline_for(comm.rank))
            self._host = host_word()
        rank, size, timeline = where
        if size > 1:
            self._start_dup()
        configure_logging(rank)
        t_validate = timeline.now() if timeline is not None else 0
        values = self._values
        agreed = {"fusion_bytes": values["fusion_bytes"], "chunk_bytes": self._chunk_bytes,
                  "device_chunk_bytes": self._device_chunk_bytes, "verify": bool(verify), "root": self._root}
        devices_key = tuple(devices) if devices is not None and isinstance(devices, _abc.Sequence) else devices
        prepared = self._prepared
        if prepared is not None and (type(params) is dict or isinstance(params, _abc.Mapping)) and prepared.matches(
                params, devices_key):
            manifest = prepared.manifest
            if manifest.settings != agreed:
                manifest.settings = agreed
        else:
            prepared = None
            manifest = None if self._settings_error else scan(params, rank=rank, size=size, root=self._root,
                                                               devices=devices, settings=agreed)
            if manifest is None:
                manifest = build_manifest(params, rank=rank, size=size, root=self._root, devices=devices,
                                          settings=agreed)
                if self._settings_error:
                    manifest.errors.append((None, self._settings_error))
        report = SyncReport(tensors=manifest.tensors, replicas=manifest.nreplicas,
                            bytes=manifest.nbytes, collectives=0, seconds=0.0, transport="host",
                            rank=rank, size=size, root=self._root)
        if size == 1:
            if manifest.errors:
                raise diagnose([_json.loads(manifest.encode())])
            if timeline is not None:
                timeline.span("validate", t_validate, tensors=manifest.tensors)
            t_fan_out = timeline.now() if timeline is not None else 0
            for param in manifest.host_params:
                for replica in param.replicas[1:]:
                    replica.data[:] = param.master.data
            if manifest.device_params:  # no peers: the device plan runs its fan-out only
                self._local_device_fan_out(manifest)
            if timeline is not None:
                timeline.span("fan-out", t_fan_out, replicas=manifest.nreplicas - manifest.tensors)
            if verify:
                self._verify(None, manifest, None, timeline)
            report.transport, report.verified = "local", bool(verify)
        else:
            self._run_collective(params, devices_key, manifest, prepared, report, values, verify,
                                 timeline, t_validate)
        report.seconds = _time.perf_counter() - start
        if timeline is not None:
            timeline.flush()
        if logger.isEnabledFor(_logging.INFO):
            logger.info(report.summary())
        return report

    def _slots(self) -> DeviceSlots:
        if self._device_slots is None:
            chunk = max(self._device_chunk_bytes, self._settings.fusion_bytes.value)
            self._device_slots = DeviceSlots(self._settings.max_concurrent.value, chunk)
        return self._device_slots

    def _local_device_fan_out(self, manifest) -> None:
        """Copy each device master into its other replicas (peer copies across devices)."""
        touched = {(r.backend, r.device) for p in manifest.device_params for r in p.replicas}
        for backend, device in touched:  # producers of the masters are done
            backend.synchronize(device)
        slots = self._slots()
        for param in manifest.device_params:
            master = param.master
            stream = slots.stream(master.backend, master.device)
            for replica in param.replicas[1:]:
                master.backend.copy(replica.data, master.data, stream)
        for backend, device in touched:  # the copies are done before the caller's next kernel
            backend.synchronize(device)

    def _verify(self, comm, manifest, call, timeline) -> None:
        start = timeline.now() if timeline is not None else 0
        to_host = (lambda view: device_to_host(view, self._slots())) if manifest.device_params else None
        _verify(comm, manifest, self._root if comm is not None else 0, call, to_host)
        if timeline is not None:
            timeline.span("verify", start, tensors=manifest.tensors)

    # -- the collective part ------------------------------------------------

    def _run_collective(self, params, devices_key, manifest, prepared, report, values, verify,
                        timeline, t_validate) -> None:
        timeout = values["timeout"]
        call = self._caller(report, timeout)
        phase, ring = "communicator duplication", None
        try:
            self._ensure_comm(call)
            phase = "validation exchange"
            bulk = isinstance(manifest, BulkManifest)  # plain numpy arrays, end to end with none of the others
            layout = prepared.layout if prepared is not None else NO_RUNS if bulk else host_layout(manifest.host_params)
            trial = self._trial
            is_root = self._comm.rank == self._root
            copy_us = (self._copy_us, 0) if is_root else (0, self._copy_us)  # root's, then the receivers'
            self._copy_us = 0
            same_layout, self._one_node, (slowest_us, root_us, receiver_us), anyone_fresh = agree(
                self._comm, manifest, call, layout.digest, (trial.elapsed_us,) + copy_us, prepared is None,
                self._host)
            runs = layout.runs if same_layout else ()
            trial.record(slowest_us)
            host_bytes = (prepared.host_bytes if prepared is not None else manifest.nbytes if bulk
                          else sum(p.nbytes for p in manifest.host_params))
            # Agreed like the rest of the manifest: every rank offers the segment alike.
            self._small = (prepared.small if prepared is not None
                           else _all_smaller(manifest, values["fusion_bytes"], bulk))
            channel, possible = MPI_CHANNEL, (MPI_CHANNEL,)
            while host_bytes:  # every rank takes the same turns: the trial's inputs are agreed
                possible = self._channels()
                channel = trial.choose(possible)
                if channel == SHARED_CHANNEL and self._node is None:
                    phase = "shared-memory set-up"  # once, on the same sync on every rank
                    self._node = NodeSegment.open(self._comm, self._root, *self._segment_geometry(values), call,
                                                  True) or False
                elif channel == CROSS_CHANNEL and self._cross is None:
                    phase = "cross-memory set-up"
                    self._cross = CrossMemory.open(self._comm, self._root, call, self._cross_memory) or False
                else:
                    break
            if host_bytes and trial.settled(possible):  # keep only the winner's buffers
                if channel == SHARED_CHANNEL and len(self._arena):
                    self._arena = Arena(0)
                if channel != SHARED_CHANNEL and self._node:
                    self._node = False
                if channel != CROSS_CHANNEL and self._cross:
                    self._cross = False
            reused = prepared is not None and prepared.runs == runs and prepared.channel == channel
            if not reused:
                prepared = self._prepare(params, devices_key, manifest, values["max_concurrent"], layout, runs,
                                         channel, host_bytes)
                prepared.small = self._small
            if channel == CROSS_CHANNEL:
                # Every rank moves the split the same way: the copy times it follows were agreed.
                rebalanced = self._cross.rebalance(root_us, receiver_us)
                if anyone_fresh or not reused:
                    # Every rank binds again when any rank's arrays may have moved: peers copy to and from them.
                    phase = "cross-memory address exchange"
                    prepared.copies = self._cross.bind(self._comm, *prepared.cross[:2], call)
                elif rebalanced:
                    prepared.copies.split()
            if timeline is not None:
                timeline.span("validate", t_validate, tensors=manifest.tensors, reused=reused)
            phase = "broadcast"
            report.fused_buckets = prepared.fused_buckets
            report.transfers = prepared.transfers
            report.channel = channel
            started = _time.perf_counter()
            if channel == SHARED_CHANNEL:
                self._broadcast_node(prepared.chunks, timeout, timeline)
            elif channel == CROSS_CHANNEL:
                phase = "cross-memory copies"
                self._broadcast_cross(prepared, call, values, report, timeline)
            else:
                ring = TrackedRing(values["max_concurrent"], timeout)
                self._broadcast(prepared.steps, ring, report, timeline)
            if host_bytes:
                trial.moved(channel, host_bytes, _time.perf_counter() - started)
            if prepared.device_steps:
                phase = "device broadcast"
                report.transport = self._broadcast_devices(prepared.device_steps, values, report, timeline)
            if verify:
                phase = "verification"
                self._verify(self._comm, manifest, call, timeline)
                report.verified = True
        except Expired as expired:
            if getattr(expired, "pending", None) is not None:  # the shared segment, the device pipeline
                pending = list(dict.fromkeys(expired.pending))
            elif phase == "broadcast":
                pending = [n for label in ring.pending_labels() for n in label]
            else:
                pending = manifest.names
            self._timed_out(phase, pending, timeout)

    def _broadcast_cross(self, prepared, call, values, report, timeline) -> None:
        """Run this rank's cross-memory copies, agree that every rank's succeeded, then fan out;
        else every rank redoes the whole host plan through MPI."""
        begin = timeline.now() if timeline is not None else 0
        start = _time.perf_counter()
        copied = prepared.copies.run()
        self._copy_us = max(1, int((_time.perf_counter() - start) * 1e6))  # steers the split (rebalance)
        if timeline is not None:
            timeline.span("cross-memory", begin, tensors=len(prepared.cross[0]) + len(prepared.cross[1]))
        everyone = _np.zeros(1, dtype=_np.int64)
        # Root's masters must not change before every receiver has read them, nor a receiver's
        # before root has written them: nobody leaves the sync before this all-reduce.
        call(self._comm.Iallreduce(_np.array([int(bool(copied))], dtype=_np.int64), everyone, op=MPI.MIN))
        if everyone[0]:
            begin = timeline.now() if timeline is not None else 0
            for dst, src in prepared.cross[2]:
                dst[:] = src
            if timeline is not None:
                timeline.span("fan-out", begin, copies=len(prepared.cross[2]))
            logger.debug("cross-memory: %d direct transfers and %d small tensors copied process to process",
                         len(prepared.cross[0]), len(prepared.cross[1]))
            return
        logger.warning("rank %d: cross-memory copies failed on some rank; every rank redoes them through MPI "
                       "now and keeps MPI", self._comm.rank)
        self._cross = False
        self._broadcast(prepared.steps, TrackedRing(values["max_concurrent"], values["timeout"]), report, timeline)

    def _channels(self) -> tuple:
        """The channels host bytes may take on the next sync, MPI first (the same on every rank)."""
        segment = self._node is not False and (self._shared_memory or (self._shared_memory is None and self._small))
        return ((MPI_CHANNEL,) + ((CROSS_CHANNEL,) if self._cross is not False else ())
                + ((SHARED_CHANNEL,) if segment else ()))

    @staticmethod
    def _caller(report, timeout):
        """``call(request)``: wait for one collective within ``timeout``, counting it in ``report``."""
        def call(request):
            if report is not None:
                report.collectives += 1
            wait_request(request, None if timeout is None else _time.monotonic() + timeout)
        return call

    def _start_dup(self) -> None:
        # The duplicate is posted before this rank builds its manifest, so the Idup's round trip
        # overlaps that work (it is waited for, under the timeout, by _ensure_comm).
        if self._comm is None and self._dup is None:
            self._dup = self._user_comm.Idup()

    def _ensure_comm(self, call) -> None:
        if self._comm is None:
            self._start_dup()
            dup, request = self._dup
            call(request)
            self._comm, self._dup = dup, None

    def _collective_exchange(self, phase: str, pending: list, exchange):
        """Run ``exchange(comm, call)`` on the library's communicator under this sync's timeout.

        For collectives outside the parameter broadcast (``sync_state``'s
        structure and scalar exchange); a timeout is handled like any other.
        """
        if self._closed or self._broken:
            raise SyncError("mpisync: this ParamSync is closed or unusable")
        timeout = self._settings.timeout.value
        call = self._caller(None, timeout)
        try:
            self._ensure_comm(call)
            return exchange(self._comm, call)
        except Expired:
            self._timed_out(phase, pending, timeout)

    def _broadcast_devices(self, steps, values, report, timeline) -> str:
        """Run the device plan with the chosen transport; return ``"staged"`` or ``"cuda-aware"``."""
        from .devices.detect import choose_transport

        transport, why = choose_transport(values["gpu_transport"])
        logger.debug("device buffers: transport %s (%s)", transport, why)
        start = timeline.now() if timeline is not None else 0
        run_device_steps(self._comm, self._root, steps, self._slots(), staged=transport == "staged",
                         timeout=values["timeout"])
        report.collectives += len(steps)
        report.transfers += len(steps)
        report.fused_buckets += sum(1 for s in steps if s.fused)
        if timeline is not None:
            timeline.span(transport, start, collectives=len(steps), bytes=sum(s.nbytes for s in steps))
        return transport

    def _plan(self, params, fusion: int, chunk: int, runs: tuple = ()) -> list:
        sizes = tuple(p.nbytes for p in params)
        key = (sizes, fusion, chunk, runs)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.pop(next(iter(self._plans)))
            plan = build_plan(list(sizes), fusion, chunk, runs)
            self._plans[key] = plan
        return plan

    def _segment_geometry(self, values) -> tuple:
        """Slots and slot bytes of the shared segment: within ``max_concurrent x fusion_bytes``
        (at least two slots), each slot large enough for a fused bucket; for sets of small
        tensors only (the segment's default use), :data:`~mpisync.intranode.SMALL_SLOTS` slots
        of one bucket each."""
        fusion = values["fusion_bytes"]
        if not self._shared_memory:
            return min(SMALL_SLOTS, max(2, values["max_concurrent"])), fusion
        slot_bytes = max(SLOT_BYTES, fusion)
        return max(2, values["max_concurrent"] * fusion // slot_bytes), slot_bytes

    def _prepare(self, params, devices_key, manifest, capacity: int, layout: Layout, runs: tuple,
                 channel: str, host_bytes: int) -> _Prepared:
        """Compile the steps for these arrays and ``channel``; keep them for the fast path when eligible."""
        fusion = manifest.settings["fusion_bytes"]
        receiving = self._comm.rank != self._root
        if isinstance(manifest, BulkManifest) and channel == MPI_CHANNEL:
            plan = bulk_plan(manifest.sizes, fusion, self._chunk_bytes)
            fused = sum(1 for t in plan if t[0])
            self._ensure_arena(fused_slots(capacity, fused, self._one_node) * fusion)
            steps = compile_bulk(manifest, plan, receiving=receiving, arena=self._arena, fusion_bytes=fusion)
            # sync_params' syncer never syncs again: the snapshot for the reuse check would go unused.
            keep = not self._one_shot
            prepared = _Prepared(tuple(params.values()) if keep else (), tuple(params) if keep else (), devices_key,
                                 (), (), manifest, layout, runs, channel, steps, [], fused, len(plan), [], host_bytes)
            self._prepared = prepared if keep else None
            return prepared
        host = manifest.host_params
        plan = self._plan(host, fusion, self._chunk_bytes, runs)
        steps, chunks = [], []
        cross = ()
        if channel == SHARED_CHANNEL:
            chunks = compile_chunks(plan, host, receiving=receiving, slots=self._node.slots,
                                    slot_bytes=self._node.slot_bytes)
        else:
            self._ensure_arena(arena_slots(plan, capacity, self._one_node) * fusion)
            steps = compile_program(host, plan, receiving=receiving, arena=self._arena,
                                    fusion_bytes=fusion)  # with cross-memory copies: run only if they fail
            if channel == CROSS_CHANNEL:
                cross = ([transfer_buffer(host, t) for t in plan if not t.fused],
                         [host[i].master.data for t in plan if t.fused for i, _, _, _ in t.pieces],
                         replica_copies(host, range(len(host))))
        device_params = manifest.device_params
        device_steps = []
        if device_params:
            device_plan = self._plan(device_params, fusion, max(self._device_chunk_bytes, fusion))
            device_steps = compile_device_steps(device_params, device_plan)
        values = tuple(params.values()) if manifest.leaves_only else ()
        torch_module = _sys.modules.get("torch")
        torch_indices = tuple(i for i, v in enumerate(values)
                              if torch_module is not None and isinstance(v, torch_module.Tensor))
        prepared = _Prepared(values, tuple(params) if values else (), devices_key, torch_indices,
                             _torch_storage(values, torch_indices), manifest, layout, runs, channel, steps, chunks,
                             sum(1 for t in plan if t.fused), len(plan), device_steps,
                             host_bytes, cross)
        if manifest.leaves_only:
            self._prepared = prepared
        return prepared

    def _ensure_arena(self, needed: int) -> None:
        """A fusion arena of at least ``needed`` bytes. Where the C loops are built it is plain memory;
        elsewhere a memory file, so a bucket packs with one ``pwritev`` (see :mod:`mpisync.arena`)."""
        if len(self._arena) < needed:
            self._prepared = None  # its steps point into the old arena
            spare = _take_spare_arena() if self._one_shot else None
            self._arena = (spare if spare is not None and len(spare) >= needed
                           else Arena(needed, vectored=False if _speedups is not None else None))

    def _broadcast_node(self, chunks, timeout, timeline) -> None:
        """Move the host chunks through the node's shared segment (no MPI data movement)."""
        start = timeline.now() if timeline is not None else 0
        clock, root = _time.monotonic, self._root

        def log(k, chunk):
            names = ", ".join(chunk.label[:5]) + (f", ... ({len(chunk.label)} tensors)" if len(chunk.label) > 5 else "")
            logger.debug("slot %d/%d: %d bytes from root %d through shared memory, %s: %s", k + 1, len(chunks),
                         chunk.nbytes, root, "fused" if chunk.pack or chunk.unpack else "direct", names)

        self._node.run(chunks, (lambda: None) if timeout is None else (lambda: clock() + timeout), timeline,
                       log if logger.isEnabledFor(_logging.DEBUG) else None)
        if timeline is not None:
            timeline.span("broadcast", start, chunks=len(chunks), channel="shared memory")

    def _broadcast(self, steps, ring, report, timeline) -> None:
        """Post every step through ``ring``."""
        comm, root = self._comm, self._root
        debug = logger.isEnabledFor(_logging.DEBUG)
        start = timeline.now() if timeline is not None else 0
        for k, step in enumerate(steps):
            ring.make_room()
            if step.after >= 0:  # the bucket that used this arena slot before is done and unpacked
                ring.retire_through(step.after)
            step.start(timeline)
            if debug:
                names = ", ".join(step.label[:5]) + (f", ... ({len(step.label)} tensors)" if len(step.label) > 5 else "")
                logger.debug("Ibcast %d/%d: %d bytes from root %d, %s: %s", k + 1, len(steps),
                             len(step.buffer[0]), root, "fused" if step.fused else "direct", names)
            request = comm.Ibcast(step.buffer, root)
            if not (step.unpack or step.fan_out):
                done = None
            elif timeline is not None:
                done = _functools.partial(step.finish, timeline)
            else:
                done = step.finish
            ring.push(request, done, step.label)
        ring.drain()
        if timeline is not None:
            timeline.span("broadcast", start, collectives=len(steps),
                          bytes=sum(len(s.buffer[0]) for s in steps))
        report.collectives += len(steps)

    def _timed_out(self, phase: str, pending: list, timeout: float) -> None:
        comm = self._user_comm
        shown = ", ".join(repr(n) for n in pending[:20])
        if len(pending) > 20:
            shown += f", ... and {len(pending) - 20} more"
        message = (
            f"mpisync: rank {comm.rank} of {comm.size}: the {phase} did not complete within "
            f"{timeout:g} s; pending parameter(s): {shown or 'none'}. Another rank may not have "
            "called sync, may have died, or may be stuck elsewhere."
        )
        self._broken = f"a sync timed out during the {phase}; its collectives may still be pending"
        if _config.abort_on_timeout():
            _sys.stderr.write(
                f"SyncTimeoutError: {message}\nmpisync: MPI cannot cancel a collective, so rank "
                f"{comm.rank} aborts the job (set MPISYNC_TIMEOUT_ABORT=0 to raise instead).\n"
            )
            _sys.stderr.flush()
            _time.sleep(_ABORT_GRACE_SECONDS)
            comm.Abort(1)
        raise SyncTimeoutError(message)


def sync_params(params: Mapping[str, Any], comm: MPI.Intracomm | None = None, *, root: int = 0,
                devices: Sequence[Any] | None = None, max_concurrent: int | None = None,
                fusion_bytes: int | None = None, gpu_transport: str | None = None, timeout: float | None = None,
                verify: bool = False) -> SyncReport:
    """Broadcast every parameter from ``root``'s master replica to every replica on every rank.

    ``params`` maps each name to one array, a sequence of replicas, or a
    mapping of device key to replica (master: ``devices[0]`` if given, else
    the first). Names are processed in ``sorted()`` order. Raises the same
    :class:`~mpisync.SyncError` on every rank when any rank's input is bad.
    See :class:`ParamSync` for the reusable form.
    """
    with ParamSync(comm, root=root, max_concurrent=max_concurrent, fusion_bytes=fusion_bytes,
                   gpu_transport=gpu_transport, timeout=timeout) as syncer:
        syncer._one_shot = True
        return syncer.sync(params, devices=devices, verify=verify)
