"""The interface a device backend implements for staged and CUDA-aware transfers.

One backend per array library (CuPy, torch CUDA, and a simulated device that
runs the same pipeline on host memory in CPU CI). Views are flat byte views in
the backend's own array type; copies are asynchronous on a stream, and events
say when they are done.
"""

from __future__ import annotations

import abc as _abc

__all__ = ["Backend"]


class Backend(_abc.ABC):
    """Device operations used by :mod:`mpisync.staged`; every copy is asynchronous on ``stream``."""

    name = "abstract"

    @_abc.abstractmethod
    def flat_bytes(self, array):
        """A flat uint8 view of a contiguous device array (no copy)."""

    @_abc.abstractmethod
    def device_of(self, array) -> int:
        """The device index holding ``array``."""

    @_abc.abstractmethod
    def synchronize(self, device: int) -> None:
        """Wait for all work on ``device``: producers done before mpisync reads, its writes visible after."""

    @_abc.abstractmethod
    def pinned(self, nbytes: int):
        """Page-locked host memory as a numpy uint8 array (what MPI reads and writes)."""

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

    def pack(self, dst, sources, stream) -> None:
        """Concatenate device ``sources`` into ``dst``; backends override with one kernel."""
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
        """What to hand mpi4py for CUDA-aware MPI (an object with ``__cuda_array_interface__`` or DLPack)."""
        return flat
