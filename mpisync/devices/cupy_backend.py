"""CuPy arrays: raw ``cudaMemcpyAsync`` on mpisync's own non-blocking streams, CuPy events."""

from __future__ import annotations

import numpy as _np

from .base import Backend

__all__ = ["CupyBackend"]


class _Stream:
    __slots__ = ("device", "stream")

    def __init__(self, device, stream):
        self.device = device
        self.stream = stream


class CupyBackend(Backend):
    """Device operations for ``cupy.ndarray``; host buffers come from ``cupy.cuda.alloc_pinned_memory``."""

    name = "cupy"

    def __init__(self):
        import cupy

        self._cp = cupy
        self._rt = cupy.cuda.runtime

    def flat_bytes(self, array):
        return array.reshape(-1).view(self._cp.uint8)

    def device_of(self, array) -> int:
        return int(array.device.id)

    def synchronize(self, device: int) -> None:
        self._cp.cuda.Device(device).synchronize()

    def pinned(self, nbytes: int):
        memory = self._cp.cuda.alloc_pinned_memory(nbytes)
        return _np.frombuffer(memory, _np.uint8, nbytes)  # the array keeps ``memory`` alive

    def empty(self, nbytes: int, device: int):
        with self._cp.cuda.Device(device):
            return self._cp.empty(nbytes, dtype=self._cp.uint8)

    def stream(self, device: int):
        with self._cp.cuda.Device(device):
            return _Stream(device, self._cp.cuda.Stream(non_blocking=True))

    def _memcpy(self, dst_ptr, src_ptr, nbytes, kind, stream) -> None:
        if nbytes:
            with self._cp.cuda.Device(stream.device):
                self._rt.memcpyAsync(dst_ptr, src_ptr, nbytes, kind, stream.stream.ptr)

    def to_host(self, dst, src, stream) -> None:
        self._memcpy(dst.ctypes.data, src.data.ptr, src.nbytes, self._rt.memcpyDeviceToHost, stream)

    def to_device(self, dst, src, stream) -> None:
        self._memcpy(dst.data.ptr, src.ctypes.data, dst.nbytes, self._rt.memcpyHostToDevice, stream)

    def copy(self, dst, src, stream) -> None:
        # cudaMemcpyDefault: with unified addressing this is also the peer copy between devices
        self._memcpy(dst.data.ptr, src.data.ptr, dst.nbytes, self._rt.memcpyDefault, stream)

    def pack(self, dst, sources, stream) -> None:
        if sources and all(s.device.id == stream.device for s in sources):
            with self._cp.cuda.Device(stream.device), stream.stream:
                self._cp.concatenate(sources, out=dst)  # one kernel for the bucket
        else:
            super().pack(dst, sources, stream)

    def record(self, stream):
        with self._cp.cuda.Device(stream.device):
            event = self._cp.cuda.Event(disable_timing=True)
            event.record(stream.stream)
        return event

    def done(self, event) -> bool:
        return bool(event.done)
