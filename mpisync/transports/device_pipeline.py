"""Device buffers through MPI: staged through pinned host memory, or straight (CUDA-aware).

Both transports run the same plan (``bulk_plan`` over the device columns'
sizes, so every rank posts the same collectives whatever its transport) and
the same pipeline: ``slots`` transfers in flight, each owning one slot (a
pinned host chunk and, for fused buckets, a device buffer), reused across
syncs. On root a transfer is: pack small tensors on the device (one kernel
per bucket), copy device -> pinned host on mpisync's stream, then ``Ibcast``
once that copy's event completes. On the other ranks: ``Ibcast`` into the
slot, then host -> device and unpack on the stream; the slot is free again
when that event completes. So the copies of one chunk overlap the broadcast
of its neighbours, and memory stays ``slots x chunk_bytes`` whatever the
model. Collectives are posted strictly in plan order on every rank.
"""

from __future__ import annotations

import collections as _collections
import dataclasses as _dc
import os as _os
import time as _time

from mpi4py import MPI

from .._runtime import failfast as _failfast
from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired
from ..params.fanout import copy_device

__all__ = [
    "DeviceStep",
    "compile_device_steps",
    "DeviceSlots",
    "run_device_steps",
    "device_to_host",
    "DEFAULT_DEVICE_CHUNK_BYTES",
]

#: Largest device transfer: big enough for full-speed copies, small enough to pipeline.
DEFAULT_DEVICE_CHUNK_BYTES = 4 << 20


@_dc.dataclass
class DeviceStep:
    """One collective over device bytes: ``views`` are the device pieces, in bucket order."""

    fused: bool
    nbytes: int
    views: list
    fan_out: list  # (destination, source) device views copied once this step's params are complete
    backend: object
    device: int  # where the first piece lives: the stream and bucket buffers are there
    devices: tuple  # every device the step reads or writes (masters and replicas)
    label: tuple


def compile_device_steps(columns, plan: list) -> list:
    """Bind ``plan`` (:func:`~mpisync.plan.transfers.bulk_plan` over the sizes of ``columns``, a
    :class:`~mpisync.params.columns.DeviceColumns`) to this rank's device views."""
    steps = []
    sizes, masters, names = columns.sizes.tolist(), columns.masters, columns.names
    for fused, first, last, nbytes in plan:
        if fused:  # members first:last, whole; their replicas are complete after it
            members = [i for i in range(first, last) if sizes[i]]
            head = masters[members[0]]
            views = [masters[i].data for i in members]
            label = tuple(names[i] for i in members)
            done = touched = last
        else:  # bytes last:last + nbytes of member first
            head = masters[first]
            views = [head.backend.slice(head.data, last, last + nbytes)]
            label = (names[first],)
            # the name's replicas are complete after its last chunk
            done = first + 1 if last + nbytes == sizes[first] else first
            touched = first + 1
        steps.append(
            DeviceStep(
                fused,
                nbytes,
                views,
                columns.fan_out(first, done),
                head.backend,
                head.device,
                columns.devices(first, touched),
                label,
            )
        )
    return steps


class DeviceSlots:
    """``count`` staging slots, each a pinned host chunk and per-device bucket buffers, made on
    first use."""

    def __init__(self, count: int, chunk_bytes: int):
        self.count = count
        self.chunk_bytes = chunk_bytes
        self._pinned: dict = {}  # (backend name, slot) -> numpy uint8
        self._device: dict = {}  # (backend name, device, slot) -> device uint8
        self._streams: dict = {}  # (backend name, device) -> stream
        self.max_busy = 0
        self.max_posted = 0  # most broadcasts root had posted and not yet acted on, at once

    def release(self) -> tuple:
        """Forget every buffer and stream (the next use makes new ones); returns what was held."""
        held = (self._pinned, self._device, self._streams)
        self._pinned, self._device, self._streams = {}, {}, {}
        return held

    def close(self) -> None:
        """Free the pinned host chunks and device buckets (what a syncer's ``close()`` does, by
        dropping its slots: nothing else refers to them)."""
        self.release()

    def pinned(self, backend, slot: int):
        """The pinned host chunk of ``slot``."""
        key = (backend.name, slot)
        if key not in self._pinned:
            self._pinned[key] = backend.pinned(self.chunk_bytes)
        return self._pinned[key]

    def device(self, backend, device: int, slot: int):
        """The device bucket buffer of ``slot`` on ``device``."""
        key = (backend.name, device, slot)
        if key not in self._device:
            self._device[key] = backend.empty(self.chunk_bytes, device)
        return self._device[key]

    def stream(self, backend, device: int):
        """mpisync's copy stream on ``device``."""
        key = (backend.name, device)
        if key not in self._streams:
            self._streams[key] = backend.stream(device)
        return self._streams[key]

    @property
    def pinned_bytes(self) -> int:
        """Pinned host memory held."""
        return sum(int(a.nbytes) for a in self._pinned.values())


class _Item:
    __slots__ = ("step", "slot", "state", "event", "request", "deadline", "buffer", "arrived")

    def __init__(self, step, slot):
        self.step, self.slot = step, slot
        self.state = self.event = self.request = self.deadline = self.buffer = None
        self.arrived = False


def _synchronize_devices(steps) -> None:
    seen = set()
    for step in steps:
        for device in step.devices:
            if (step.backend.name, device) not in seen:
                seen.add((step.backend.name, device))
                step.backend.synchronize(device)


def run_device_steps(
    comm, root: int, steps: list, slots: DeviceSlots, *, staged: bool, timeout
) -> None:
    """Broadcast every device step from ``root``; returns when all bytes and fan-outs are on the
    devices.

    Raises :class:`~mpisync._runtime.ring.Expired` (with ``.pending`` labels) when a broadcast
    outlives ``timeout`` seconds.
    """
    if not steps:
        return
    is_root = comm.rank == root
    if is_root:  # decide now, before the first broadcast, whether buckets are packed by a kernel
        for backend, device in {(s.backend, s.device) for s in steps if s.fused}:
            backend.check_kernels(device)
    _synchronize_devices(steps)  # whatever produced the tensors is done before mpisync copies them
    free = _collections.deque(range(slots.count))
    flight: _collections.deque = _collections.deque()
    upcoming = 0
    spin_start = _time.monotonic()
    lookout = _failfast.Lookout(comm)  # a rank of comm that ended its script ends the wait too
    while upcoming < len(steps) or flight:
        progressed = False
        while upcoming < len(steps) and free:  # admit as many transfers as there are free slots
            item = _Item(steps[upcoming], free.popleft())
            _admit(comm, root, item, slots, staged, is_root, timeout)
            flight.append(item)
            upcoming += 1
            progressed = True
        slots.max_busy = max(slots.max_busy, slots.count - len(free))
        progressed = _advance(comm, root, flight, slots, staged, is_root, timeout) or progressed
        finished = [item for item in flight if item.state == "done"]
        if finished:  # a slot is free as soon as its transfer is done, in whatever order
            free.extend(item.slot for item in finished)
            flight = _collections.deque(item for item in flight if item.state != "done")
        if progressed:
            spin_start = _time.monotonic()
            continue
        now = _time.monotonic()
        expired = [
            i
            for i in flight
            if i.state == "broadcasting"
            and not i.arrived
            and i.deadline is not None
            and now > i.deadline
        ]
        if expired or lookout.gone(now):
            _abandon(flight, slots)
            error = Expired()
            error.pending = [n for i in flight for n in i.step.label]
            raise error
        if now - spin_start < 0.5:
            _os.sched_yield()
        else:
            _time.sleep(0.0005)
    _synchronize_devices(steps)  # mpisync's writes are complete before the caller's next kernel


def _advance(comm, root, flight, slots, staged, is_root, timeout) -> bool:
    """One pass over the transfers in flight (in plan order); whether anything moved.

    Two orders, kept apart so that neither holds the other back:
    - posting: a broadcast is posted once its chunk is on the host (root) and every earlier
      one has been posted; collectives must be posted in the same order on every rank;
    - acting on arrivals: in plan order too, since MPI may complete a later Ibcast first and a
      parameter's fan-out, enqueued with its last chunk, must follow the device copies of all
      its earlier chunks. An earlier broadcast still on the wire never delays a later posting.
    """
    progressed = False
    # every earlier transfer has posted its broadcast / had its arrival acted on
    posting = acting = True
    for item in flight:
        if item.state == "preparing":
            if posting and item.step.backend.done(item.event):
                _post(comm, root, item, timeout)
                progressed = True
            else:
                posting = False
        if item.state == "broadcasting":
            if not item.arrived and item.request.Test():
                item.arrived = progressed = True
            if item.arrived and acting:
                _received(item, slots, staged, is_root)
                progressed = True
        if item.state in ("preparing", "broadcasting"):
            acting = False
        elif item.state == "finishing" and item.step.backend.done(item.event):
            item.state = "done"
            progressed = True
    if is_root:
        posted = sum(1 for item in flight if item.state == "broadcasting")
        slots.max_posted = max(slots.max_posted, posted)
    return progressed


def _abandon(flight, slots) -> None:
    # A broadcast may still write into the buffers of transfers abandoned on a timeout (bounded by
    # slots x chunk per syncer).
    keep_alive([(item.request, item.buffer) for item in flight], slots.release())


def _admit(comm, root, item, slots, staged, is_root, timeout) -> None:
    step, backend = item.step, item.step.backend
    stream = slots.stream(backend, step.device)
    n = step.nbytes
    if is_root:
        if step.fused:
            source = backend.slice(slots.device(backend, step.device, item.slot), 0, n)
            backend.pack(source, step.views, stream)
        else:
            source = step.views[0]
        if staged:
            item.buffer = slots.pinned(backend, item.slot)[:n]
            backend.to_host(item.buffer, source, stream)
        else:
            item.buffer = backend.mpi_buffer(source)
        copy_device(step.fan_out, backend, stream)  # root's masters already hold the bytes
        item.event = backend.record(stream)
        item.state = "preparing"
    else:
        if staged:
            item.buffer = slots.pinned(backend, item.slot)[:n]
        elif step.fused:
            item.buffer = backend.mpi_buffer(
                backend.slice(slots.device(backend, step.device, item.slot), 0, n)
            )
        else:
            item.buffer = backend.mpi_buffer(step.views[0])
        _post(comm, root, item, timeout)


def _post(comm, root, item, timeout) -> None:
    item.request = comm.Ibcast([item.buffer, MPI.BYTE], root)
    item.deadline = None if timeout is None else _time.monotonic() + timeout
    item.state = "broadcasting"


def _received(item, slots, staged, is_root) -> None:
    if is_root:
        item.state = "done"
        return
    step, backend = item.step, item.step.backend
    stream = slots.stream(backend, step.device)
    n = step.nbytes
    if step.fused:
        bucket = backend.slice(slots.device(backend, step.device, item.slot), 0, n)
        if staged:
            backend.to_device(bucket, item.buffer, stream)
        backend.unpack(step.views, bucket, stream)
    elif staged:
        backend.to_device(step.views[0], item.buffer, stream)
    copy_device(step.fan_out, backend, stream)
    item.event = backend.record(stream)
    item.state = "finishing"


def device_to_host(view, slots: DeviceSlots):
    """A host numpy copy of a device view's bytes (for verification digests)."""
    import numpy as np

    backend = view.backend
    out = np.empty(view.nbytes, dtype=np.uint8)
    stream = slots.stream(backend, view.device)
    pinned = slots.pinned(backend, 0)
    for start in range(0, view.nbytes, slots.chunk_bytes):
        n = min(slots.chunk_bytes, view.nbytes - start)
        backend.to_host(pinned[:n], backend.slice(view.data, start, start + n), stream)
        event = backend.record(stream)
        while not backend.done(event):
            _os.sched_yield()
        out[start : start + n] = pinned[:n]
    return out
