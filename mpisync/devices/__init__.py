"""Internal, no stability promise: device (GPU) buffers.

Device (GPU) buffers: backends by array library, and CUDA-aware MPI detection."""

from __future__ import annotations

import sys as _sys

from .base import Backend

__all__ = ["Backend", "backend_for"]

_BACKENDS: dict = {}


def _get(name: str) -> Backend:
    backend = _BACKENDS.get(name)
    if backend is None:
        cls: type[Backend]
        if name == "cupy":
            from .cupy_backend import CupyBackend as cls
        elif name == "torch":
            from .torch_backend import TorchBackend as cls
        else:
            from .simulated import BACKEND

            _BACKENDS[name] = BACKEND
            return BACKEND
        backend = _BACKENDS[name] = cls()
    return backend


def backend_for(obj) -> Backend | None:
    """The backend for a device array, or ``None`` when ``obj`` is not one mpisync knows."""
    from .simulated import SimulatedDeviceArray

    if isinstance(obj, SimulatedDeviceArray):
        return _get("simulated")
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.device.type == "cuda":
        return _get("torch")
    cupy = _sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return _get("cupy")
    return None
