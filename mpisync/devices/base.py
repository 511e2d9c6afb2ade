"""The interface a device backend implements for staged and CUDA-aware transfers.

One backend per array library (CuPy, torch CUDA, and a simulated device that
runs the same pipeline on host memory in CPU CI). Views are flat byte views in
the backend's own array type; copies are asynchronous on a stream, and events
say when they are done.
"""

from __future__ import annotations

import abc as _abc
import logging as _logging

__all__ = ["Backend"]

_logger = _logging.getLogger("mpisync")


class Backend(_abc.ABC):
    """Device operations used by :mod:`mpisync.transports.device_pipeline`; every copy is
    asynchronous on ``stream``."""

    name = "abstract"
    # see __init__ (class-level too, for subclasses that do not call it)
    kernel_failure: str | None = None

    @_abc.abstractmethod
    def flat_bytes(self, array):
        """A flat uint8 view of a contiguous device array (no copy)."""

    @_abc.abstractmethod
    def device_of(self, array) -> int:
        """The device index holding ``array``."""

    @_abc.abstractmethod
    def synchronize(self, device: int) -> None:
        """Wait for all work on ``device``: producers done before mpisync reads, its writes visible
        after."""

    @_abc.abstractmethod
    def pinned(self, nbytes: int):
        """Page-locked host memory as a numpy uint8 array (what MPI reads and writes).

        The array (through its ``base``) is all that keeps the memory: the backend keeps no
        reference, so it is freed when its owner (a syncer's
        :class:`~mpisync.transports.device_pipeline.DeviceSlots`)
        lets go of it.
        """

    @_abc.abstractmethod
    def empty(self, nbytes: int, device: int):
        """Uninitialised device bytes."""

    @_abc.abstractmethod
    def stream(self, device: int):
        """A stream for mpisync's copies on ``device`` (not the default stream)."""

    @_abc.abstractmethod
    def to_host(self, dst, src, stream) -> None:
        """Device ``src`` -> pinned host ``dst`` (same length)."""

    @_abc.abstractmethod
    def to_device(self, dst, src, stream) -> None:
        """Pinned host ``src`` -> device ``dst`` (same length)."""

    @_abc.abstractmethod
    def copy(self, dst, src, stream) -> None:
        """Device -> device, possibly across devices (peer copy)."""

    @_abc.abstractmethod
    def record(self, stream):
        """An event that completes when everything enqueued on ``stream`` so far has."""

    @_abc.abstractmethod
    def done(self, event) -> bool:
        """Whether ``event`` completed (never blocks)."""

    def __init__(self):
        # : Why fused buckets are packed with one copy per tensor instead of one kernel (None:
        # kernels work).
        self.kernel_failure = None
        self._kernels_checked: set = set()

    def check_kernels(self, device: int) -> bool:
        """Whether :meth:`pack` may use its kernel on ``device``; compiles it once, never raises.

        Called on root before a sync's first transfer, so a kernel that cannot be built
        (CuPy compiles at run time with NVRTC) is known before any broadcast is posted:
        the buckets are then packed with per-tensor copies, the same bytes.
        """
        checked = self.__dict__.setdefault("_kernels_checked", set())
        if self.kernel_failure is None and device not in checked:
            try:
                self.build_kernels(device)
            # NVRTC missing or mismatched, no GPU code for this device, ...
            except Exception as exc:
                self._kernels_failed(exc)
            checked.add(device)
        return self.kernel_failure is None

    def build_kernels(self, device: int) -> None:
        """Compile (or load) what :meth:`pack_kernel` runs on ``device``; raise if it cannot be."""

    def pack_kernel(self, dst, sources, stream) -> bool:
        """Pack ``sources`` into ``dst`` with one kernel; ``False`` when this backend has none for
        them."""
        return False

    def _kernels_failed(self, exc: Exception) -> None:
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        self.kernel_failure = f"{type(exc).__name__}: {first_line}"
        _logger.warning(
            "mpisync: %s kernels unavailable (%s); fused buckets are packed with one device "
            "copy per tensor",
            self.name,
            self.kernel_failure,
        )

    def pack(self, dst, sources, stream) -> None:
        """Concatenate device ``sources`` into ``dst``: one kernel where the backend has one and it
        builds, else (or if it fails before launching) one device copy per tensor."""
        if sources and self.kernel_failure is None:
            try:
                if self.pack_kernel(dst, sources, stream):
                    return
            except Exception as exc:  # raised while compiling, before anything was enqueued
                self._kernels_failed(exc)
        self.pack_copies(dst, sources, stream)

    def pack_copies(self, dst, sources, stream) -> None:
        """Concatenate device ``sources`` into ``dst`` with one device copy each."""
        offset = 0
        for src in sources:
            n = self.length(src)
            self.copy(self.slice(dst, offset, offset + n), src, stream)
            offset += n

    def unpack(self, destinations, src, stream) -> None:
        """Split device ``src`` into ``destinations`` (the reverse of :meth:`pack`)."""
        offset = 0
        for dst in destinations:
            n = self.length(dst)
            self.copy(dst, self.slice(src, offset, offset + n), stream)
            offset += n

    def slice(self, flat, start: int, stop: int):
        """Bytes ``start:stop`` of a flat view."""
        return flat[start:stop]

    def length(self, flat) -> int:
        """Bytes in a flat view."""
        return int(flat.nbytes)

    def mpi_buffer(self, flat):
        """What to hand mpi4py for CUDA-aware MPI (an object with ``__cuda_array_interface__`` or
        DLPack)."""
        return flat
