"""Adapt user arrays (numpy, torch CPU, DLPack, buffer protocol) to flat byte views.

A broadcast moves bytes, not numbers: every supported array becomes a
one-dimensional byte ``memoryview`` of its own memory (no copy; slice
assignment between memoryviews is the cheapest copy Python has), plus the
shape and a dtype name that is the same for equal dtypes across libraries
(``numpy.float32`` and ``torch.float32`` are both ``"float32"``).
"""

from __future__ import annotations

import sys as _sys
import typing as _typing

import numpy as _np

from ..devices.base import Backend
from ..devices.simulated import SimulatedDeviceArray

__all__ = [
    "ArrayView",
    "UnsupportedArray",
    "as_array_view",
    "is_array_like",
    "numpy_view",
    "torch_cpu_views",
]


class UnsupportedArray(Exception):
    """Raised by :func:`as_array_view` with the reason an object cannot be synced."""


class ArrayView(_typing.NamedTuple):
    """A flat byte view of one replica, with what validation needs to know about it.

    A NamedTuple because a manifest builds one per replica on every cold sync.
    """

    # host: 1-D "B" memoryview; device: the backend's flat uint8 view; both alias the replica
    data: _typing.Any
    shape: tuple
    dtype: str
    writable: bool
    kind: str = "host"  # or "device"
    backend: Backend | None = None  # device arrays: their backend
    device: int = -1

    @property
    def nbytes(self) -> int:
        """Bytes of the replica."""
        return int(self.data.nbytes)


_DTYPE_NAMES: dict = {}


def _dtype_name(dtype: _np.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is not None:
        return name
    if dtype.hasobject:
        raise UnsupportedArray(f"dtype {dtype} holds Python objects, not fixed-size values")
    name = dtype.name if dtype.fields is None else str(dtype.descr)
    if dtype.byteorder == (">" if _sys.byteorder == "little" else "<"):
        name = dtype.byteorder + name
    _DTYPE_NAMES[dtype] = name
    return name


# The memoryview(ndarray) calls below carry type: ignore[arg-type]: numpy's stubs declare the
# buffer protocol of ndarray for Python >= 3.12 only.
def _byte_view(array: _np.ndarray) -> memoryview:
    try:
        return memoryview(array).cast("B")  # type: ignore[arg-type]
    except (TypeError, ValueError):  # zero-size, or a dtype the buffer protocol cannot describe
        return memoryview(array.reshape(-1).view(_np.uint8))  # type: ignore[arg-type]


def _from_numpy(array: _np.ndarray) -> ArrayView:
    # Called once per tensor on every cold sync: the cast itself proves C-contiguity
    # (it refuses strided views), so the slower flags lookup runs only when it fails.
    try:
        data = memoryview(array).cast("B")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        if not array.flags.c_contiguous:
            raise UnsupportedArray(
                f"numpy array with strides {array.strides} is not C-contiguous (a transposed or "
                "sliced view?); sync a C-contiguous array instead: a = np.ascontiguousarray(a) "
                "before the sync, then use that copy"
            ) from None
        data = _byte_view(array)
    dtype = _DTYPE_NAMES.get(array.dtype) or _dtype_name(array.dtype)
    return ArrayView(data, array.shape, dtype, not data.readonly)


#: :func:`as_array_view` for an object known to be exactly a ``numpy.ndarray`` (the common case).
numpy_view = _from_numpy


def _is_torch_tensor(obj) -> bool:
    torch = _sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _from_torch(tensor) -> ArrayView:
    import torch

    if tensor.layout != torch.strided:
        raise UnsupportedArray(f"torch tensor with layout {tensor.layout} is not a dense array")
    if tensor.device.type not in ("cpu", "cuda"):
        raise UnsupportedArray(
            f"torch tensor on device {tensor.device}: only CPU and CUDA tensors are supported"
        )
    if not tensor.is_contiguous():
        raise UnsupportedArray(
            f"torch tensor with stride {tensor.stride()} is not contiguous (a transposed or "
            "sliced view?); make it contiguous in place before the sync: "
            "param.data = param.data.contiguous()"
        )
    if tensor.is_quantized or tensor.is_complex() and tensor.is_conj():
        raise UnsupportedArray("quantized or lazily conjugated torch tensors are not supported")
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.device.type == "cuda":
        return _device_view(tensor, tuple(tensor.shape), dtype)
    tensor = tensor.detach()
    try:
        data = _byte_view(tensor.numpy())
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy lacks
        data = memoryview(tensor.reshape(-1).view(torch.uint8).numpy())
    return ArrayView(data, tuple(tensor.shape), dtype, True)


def torch_cpu_views(values) -> list | None:
    """The numpy views of ``values`` when every one is a plain torch CPU tensor (or ``Parameter``)
    that
    numpy can view as it is, else ``None`` (the general path then says what is wrong, if anything).

    ``Tensor.numpy()`` refuses what a view cannot carry (a device, a dtype numpy lacks, the lazy
    conjugate and negative bits, sparse layouts), so a view has the tensor's address, shape,
    strides and dtype: the bulk path and the re-check read them in C instead of per tensor in
    Python.
    """
    torch = _sys.modules.get("torch")
    if torch is None:
        return None
    kinds = (torch.Tensor, torch.nn.Parameter)
    views = []
    try:
        for value in values:
            if type(value) not in kinds:
                return None
            views.append((value.detach() if value.requires_grad else value).numpy())
    except (TypeError, RuntimeError, ValueError):
        return None
    return views


def _is_gpu_object(obj) -> bool:
    return hasattr(obj, "__cuda_array_interface__") or isinstance(obj, SimulatedDeviceArray)


def _device_view(array, shape: tuple, dtype: str) -> ArrayView:
    from ..devices import backend_for

    backend = backend_for(array)
    assert backend is not None  # the callers pass device arrays backend_for knows
    return ArrayView(
        backend.flat_bytes(array), shape, dtype, True, "device", backend, backend.device_of(array)
    )


def _from_device(obj) -> ArrayView:
    from ..devices import backend_for

    if backend_for(obj) is None:
        raise UnsupportedArray(
            f"{type(obj).__module__}.{type(obj).__qualname__} is a GPU buffer of a library mpisync "
            "does "
            "not support; use a CuPy array or a torch CUDA tensor"
        )
    contiguous = (
        obj.is_contiguous() if hasattr(obj, "is_contiguous") else bool(obj.flags.c_contiguous)
    )
    if not contiguous:
        raise UnsupportedArray(
            f"{type(obj).__qualname__} on the device is not C-contiguous; sync a contiguous copy "
            "(cupy.ascontiguousarray(a), or param.data = param.data.contiguous() for a tensor)"
        )
    dtype = _np.dtype(obj.dtype)
    return _device_view(obj, tuple(obj.shape), _DTYPE_NAMES.get(dtype) or _dtype_name(dtype))


def is_array_like(obj) -> bool:
    """Whether ``obj`` looks like one array (rather than a container of replicas)."""
    if isinstance(obj, _np.ndarray) or _is_torch_tensor(obj) or _is_gpu_object(obj):
        return True
    if hasattr(obj, "__dlpack__"):
        return True
    if isinstance(obj, (str, list, tuple, dict)):
        return False
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def as_array_view(obj) -> ArrayView:
    """Return the flat byte view of one replica, or raise :class:`UnsupportedArray` saying why."""
    if type(obj) is _np.ndarray or isinstance(obj, _np.ndarray):
        return _from_numpy(obj)
    if _is_torch_tensor(obj):
        return _from_torch(obj)
    if _is_gpu_object(obj):
        return _from_device(obj)
    if hasattr(obj, "__dlpack__"):
        try:
            array = _np.from_dlpack(obj)
        except Exception as exc:  # the producer says why (device, dtype, ...)
            raise UnsupportedArray(
                f"DLPack export of {type(obj).__qualname__} failed: {exc}"
            ) from None
        return _from_numpy(array)
    try:
        buffer = memoryview(obj)
    except TypeError:
        raise UnsupportedArray(
            f"unsupported object of type {type(obj).__module__}.{type(obj).__qualname__}: "
            "expected a numpy array, a torch CPU tensor, or an object with the buffer "
            "protocol or DLPack"
        ) from None
    if not buffer.c_contiguous:
        raise UnsupportedArray(
            f"{type(obj).__qualname__} buffer is not C-contiguous; sync a C-contiguous copy "
            "(np.ascontiguousarray)"
        )
    try:
        array = _np.asarray(buffer)
    except (TypeError, ValueError) as exc:
        raise UnsupportedArray(
            f"buffer format {buffer.format!r} is not understood: {exc}"
        ) from None
    return _from_numpy(array)
