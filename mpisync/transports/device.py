"""The device transport: device buffers staged through pinned host memory or sent CUDA-aware.

A thin wrapper over :mod:`mpisync.transports.device_pipeline` (its pipeline and staging slots),
giving the engine the same shape as the host transports: compile per
parameter set, run per sync, close once. It also holds the local fan-out of
device replicas (one rank, no peers) and the device-to-host copies that
verification digests.
"""

from __future__ import annotations

from ..params.columns import DeviceColumns
from ..params.fanout import copy_device
from ..plan.transfers import bulk_plan
from .device_pipeline import (
    DEFAULT_DEVICE_CHUNK_BYTES,
    DeviceSlots,
    compile_device_steps,
    device_to_host,
    run_device_steps,
)

__all__ = ["DeviceTransport"]


class DeviceTransport:
    """Device steps for one syncer; staging slots made on first use, freed by :meth:`close`."""

    name = "device"

    def __init__(self, capacity: int, fusion: int, chunk_bytes: int = DEFAULT_DEVICE_CHUNK_BYTES):
        self.capacity, self.fusion = capacity, fusion
        self.chunk_bytes = max(chunk_bytes, fusion)
        self._slots: DeviceSlots | None = None

    @property
    def slots(self) -> DeviceSlots:
        """The staging slots (pinned host chunks and device buckets)."""
        if self._slots is None:
            self._slots = DeviceSlots(self.capacity, self.chunk_bytes)
        return self._slots

    def compile(self, columns: DeviceColumns) -> list:
        """The device steps for the device masters ``columns`` (sorted, as the manifest gives
        them)."""
        if not len(columns):
            return []
        plan = bulk_plan(columns.sizes, self.fusion, self.chunk_bytes)
        return compile_device_steps(columns, plan)

    def run(self, comm, root: int, steps: list, gpu_transport: str, timeout, report, trace) -> str:
        """Broadcast ``steps``; returns the transport used (``"staged"`` or ``"cuda-aware"``)."""
        from .._runtime.observe import logger
        from ..devices.detect import choose_transport

        transport, why = choose_transport(gpu_transport)
        logger.debug("device buffers: transport %s (%s)", transport, why)
        start = trace.now()
        run_device_steps(
            comm, root, steps, self.slots, staged=transport == "staged", timeout=timeout
        )
        report.collectives += len(steps)
        report.transfers += len(steps)
        report.fused_buckets += sum(1 for s in steps if s.fused)
        trace.span(transport, start, collectives=len(steps), bytes=sum(s.nbytes for s in steps))
        return transport

    def fan_out_local(self, columns: DeviceColumns) -> None:
        """Copy each device master of ``columns`` into its other replicas (one rank: no peers)."""
        touched = {(r.backend, r.device) for views in columns.replicas.values() for r in views}
        for backend, device in touched:  # producers of the masters are done
            backend.synchronize(device)
        for index in columns.replicas:
            master = columns.masters[index]
            copy_device(
                columns.fan_out(index, index + 1),
                master.backend,
                self.slots.stream(master.backend, master.device),
            )
        for backend, device in touched:  # the copies are done before the caller's next kernel
            backend.synchronize(device)

    def to_host(self, view):
        """A host copy of a device view's bytes (for verification)."""
        return device_to_host(view, self.slots)

    def close(self) -> None:
        """Drop the staging slots."""
        self._slots = None
