"""A simulated device: host memory behind the device interface, with truly asynchronous streams.

It lets the staged pipeline (chunking, ordering, slot reuse, overlap) and the
CUDA-aware path run with real MPI in CPU CI. Each stream is a worker thread
that runs its copies in order (numpy releases the GIL while copying); an event
is set when the stream reaches it. ``SimulatedDeviceArray`` is the "device
array": it wraps a numpy array and a device index, and hides the buffer
protocol so it can never be mistaken for host memory.
"""

from __future__ import annotations

import queue as _queue
import threading as _threading
import weakref as _weakref

import numpy as _np

from .base import Backend

__all__ = ["SimulatedDeviceArray", "SimulatedBackend", "BACKEND"]


class SimulatedDeviceArray:
    """An array "on" simulated device ``device``; ``.get()`` copies it back to a numpy array."""

    __slots__ = ("_array", "device")

    def __init__(self, array, device: int = 0):
        self._array = _np.asarray(array)
        self.device = device

    @property
    def shape(self):
        return self._array.shape

    @property
    def dtype(self):
        return self._array.dtype

    @property
    def nbytes(self) -> int:
        return self._array.nbytes

    def is_contiguous(self) -> bool:
        """Whether the simulated device memory is C-contiguous."""
        return bool(self._array.flags.c_contiguous)

    def get(self) -> _np.ndarray:
        """A host copy (as ``cupy.ndarray.get``)."""
        return self._array.copy()

    def __getitem__(self, index):
        return SimulatedDeviceArray(self._array[index], self.device)


class _Stream:
    def __init__(self):
        self._work: _queue.SimpleQueue = _queue.SimpleQueue()
        self._thread = _threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            job = self._work.get()
            job()

    def enqueue(self, job) -> None:
        self._work.put(job)


class SimulatedBackend(Backend):
    """The device interface over host memory; counters let tests check reuse and bounds."""

    name = "simulated"

    def __init__(self):
        super().__init__()
        self._streams: dict = {}
        self.pinned_allocations = 0
        self.pinned_bytes = 0
        # allocated and not yet freed: pinned memory belongs to its syncer
        self.pinned_live_bytes = 0
        # tests: "build" (as without NVRTC) or "pack" (failing mid-sync), else None
        self.kernel_fault = None
        self.device_allocations = 0
        self.copies = {"to_host": 0, "to_device": 0, "copy": 0, "pack": 0, "unpack": 0}

    def flat_bytes(self, array):
        return array._array.reshape(-1).view(_np.uint8)

    def device_of(self, array) -> int:
        return array.device

    def synchronize(self, device: int) -> None:
        stream = self._streams.get(device)
        if stream is not None:
            event = self.record(stream)
            event.wait()

    def pinned(self, nbytes: int):
        self.pinned_allocations += 1
        self.pinned_bytes += nbytes
        self.pinned_live_bytes += nbytes
        block = _np.empty(nbytes, dtype=_np.uint8)
        # views keep ``block`` alive (their base)
        _weakref.finalize(block, self._pinned_freed, nbytes)
        return block

    def _pinned_freed(self, nbytes: int) -> None:
        self.pinned_live_bytes -= nbytes

    def simulate_kernel_fault(self, where) -> None:
        """Tests: make the "kernel" fail to build (``"build"``), fail when packing (``"pack"``), or
        work (None)."""
        self.kernel_fault = where
        self.kernel_failure = None
        self._kernels_checked = set()

    def empty(self, nbytes: int, device: int):
        self.device_allocations += 1
        return _np.empty(nbytes, dtype=_np.uint8)

    def stream(self, device: int):
        if device not in self._streams:
            self._streams[device] = _Stream()
        return self._streams[device]

    def _copy(self, kind, dst, src, stream) -> None:
        self.copies[kind] += 1
        stream.enqueue(lambda: _np.copyto(dst, src))

    def to_host(self, dst, src, stream) -> None:
        self._copy("to_host", dst, src, stream)

    def to_device(self, dst, src, stream) -> None:
        self._copy("to_device", dst, src, stream)

    def copy(self, dst, src, stream) -> None:
        self._copy("copy", dst, src, stream)

    def build_kernels(self, device: int) -> None:
        if self.kernel_fault == "build":
            raise RuntimeError(
                "simulated: the pack kernel cannot be compiled (as with NVRTC missing)"
            )

    def pack_kernel(self, dst, sources, stream) -> bool:
        if not self.check_kernels(0):
            return False
        if self.kernel_fault == "pack":
            raise RuntimeError(
                "simulated: compiling the pack kernel failed in the middle of a sync"
            )
        self.copies["pack"] += 1  # one "kernel" per bucket
        stream.enqueue(lambda: _np.concatenate(sources, out=dst))
        return True

    def unpack(self, destinations, src, stream) -> None:
        self.copies["unpack"] += 1

        def job():
            offset = 0
            for d in destinations:
                d[...] = src[offset : offset + d.nbytes]
                offset += d.nbytes

        stream.enqueue(job)

    def record(self, stream):
        event = _threading.Event()
        stream.enqueue(event.set)
        return event

    def done(self, event) -> bool:
        return event.is_set()


BACKEND = SimulatedBackend()
