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
    """Device operations for ``cupy.ndarray``; host buffers come from
    ``cupy.cuda.alloc_pinned_memory``."""

    name = "cupy"

    def __init__(self):
        import cupy

        super().__init__()
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

    def build_kernels(self, device: int) -> None:
        # cupy.concatenate compiles its kernels with NVRTC on first use: build them now, on a
        # bucket of several pieces and of two (CuPy takes other paths for few and many arrays).
        with self._cp.cuda.Device(device):
            for count in (2, 8):
                parts = [self._cp.full(i + 1, i, dtype=self._cp.uint8) for i in range(count)]
                out = self._cp.empty(count * (count + 1) // 2, dtype=self._cp.uint8)
                self._cp.concatenate(parts, out=out)
                want = _np.concatenate([_np.full(i + 1, i, dtype=_np.uint8) for i in range(count)])
                if out.get().tobytes() != want.tobytes():
                    raise RuntimeError("cupy.concatenate returned wrong bytes")

    def pack_kernel(self, dst, sources, stream) -> bool:
        if not all(s.device.id == stream.device for s in sources) or not self.check_kernels(
            stream.device
        ):
            return False
        with self._cp.cuda.Device(stream.device), stream.stream:
            self._cp.concatenate(sources, out=dst)  # one kernel for the bucket
        return True

    def record(self, stream):
        with self._cp.cuda.Device(stream.device):
            event = self._cp.cuda.Event(disable_timing=True)
            event.record(stream.stream)
        return event

    def done(self, event) -> bool:
        return bool(event.done)
