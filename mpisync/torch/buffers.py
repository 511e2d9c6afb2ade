"""Host buffers MPI reduces for torch tensors, and what to do with them afterwards.

A contiguous CPU tensor is reduced in place. Anything else (a CUDA tensor, a
non-contiguous view) goes through a host copy written back when the operation
completes. ``float16``/``bfloat16`` (which MPI and numpy cannot reduce) are
reduced in ``float32`` copies, rounded once on the way back. ``avg`` of an
integer tensor sums in an ``int64`` copy, so that the sum cannot overflow the
tensor's dtype before the (floor) division. ``min``/``max`` of floats reduce the
integers of the floats' total order (:func:`mpisync.allreduce.ops.to_ordered`),
so a NaN wins on every rank with the same bytes, as numpy's and torch's
``minimum``/``maximum``.
"""

from __future__ import annotations

import threading as _threading

import numpy as _np
import torch
from mpi4py import MPI

from ..allreduce.ops import from_ordered, to_ordered

__all__ = [
    "Reduction",
    "ReduceBuffer",
    "Scratch",
    "SCRATCH",
    "reduction",
    "reduce_problem",
    "in_place_array",
]

_HALF = (torch.float16, torch.bfloat16)
# Dtypes MPI reduces as they are, in the tensor's own memory (numpy and MPI know them).
_IN_PLACE = frozenset(
    (torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
)
_BITWISE = ("band", "bor", "bxor")
# Dtypes MPI reduces, as they are or through a copy (half precision in float32); any other
# (bool, the float8 types, complex32, the bits and uint1-7 types) is refused before anything is
# posted.
_REDUCIBLE = _IN_PLACE | frozenset(
    (*_HALF, torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.uint64)
)


class Reduction:
    """A torch ``ReduceOp`` as mpisync runs it: ``name``, the ``mpi_op``, and ``code`` (what the
    argument check compares)."""

    __slots__ = ("name", "mpi_op", "code")

    def __init__(self, name: str, mpi_op, code: int):
        self.name, self.mpi_op, self.code = name, mpi_op, code

    @property
    def average(self) -> bool:
        """Whether the sum is divided by the number of ranks afterwards."""
        return self.name == "avg"

    def ordered(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is reduced as the integers of its floats' total order."""
        return self.name in ("min", "max") and tensor.is_floating_point()


_REDUCTIONS: dict = {}


def reduction(op) -> tuple:
    """``(Reduction, None)`` for a ``torch.distributed.ReduceOp``, or ``(None, problem)``."""
    kind = getattr(op, "op", op)  # a ReduceOp wraps its RedOpType (hashable)
    found = _REDUCTIONS.get(kind)
    if found is None:
        from torch.distributed import ReduceOp

        table = {
            ReduceOp.SUM: ("sum", MPI.SUM),
            ReduceOp.AVG: ("avg", MPI.SUM),
            ReduceOp.PRODUCT: ("prod", MPI.PROD),
            ReduceOp.MIN: ("min", MPI.MIN),
            ReduceOp.MAX: ("max", MPI.MAX),
            ReduceOp.BAND: ("band", MPI.BAND),
            ReduceOp.BOR: ("bor", MPI.BOR),
            ReduceOp.BXOR: ("bxor", MPI.BXOR),
        }
        if kind not in table:
            return None, f"reduce op {kind} is not supported by mpisync"
        name, mpi_op = table[kind]
        found = _REDUCTIONS[kind] = Reduction(name, mpi_op, int(kind) + 1)
    return found, None


def reduce_problem(red: Reduction, tensors) -> str | None:
    """Why ``red`` cannot reduce one of ``tensors`` (found before anything is posted), or None."""
    for tensor in tensors:
        if tensor.dtype not in _REDUCIBLE:
            return f"mpisync cannot reduce a {tensor.dtype} tensor"
        if red.name in _BITWISE and (tensor.is_floating_point() or tensor.is_complex()):
            return f"bitwise reductions need integer tensors, got {tensor.dtype}"
        if red.name in ("min", "max") and tensor.is_complex():
            return f"min/max are not defined for complex tensors ({tensor.dtype})"
    return None


def in_place_array(tensor: torch.Tensor, red: Reduction):
    """The numpy view MPI reduces ``tensor`` through in place (no copy, nothing to do afterwards),
    or None when it needs a :class:`ReduceBuffer`."""
    if tensor.dtype not in _IN_PLACE or not tensor.is_cpu or not tensor.is_contiguous():
        return None
    if red.average or red.ordered(tensor):
        return None
    # numpy reshapes the view for less than torch reshapes the tensor (per-call cost)
    return tensor.detach().numpy().reshape(-1)


def _host(tensor: torch.Tensor, wide: bool, stage: bool = False) -> torch.Tensor:
    """The CPU tensor MPI reduces for ``tensor``: itself when possible, else a host copy
    (``float32`` for half precision; ``int64`` for integers when ``wide``; always a copy when
    ``stage``)."""
    if wide and not (tensor.is_floating_point() or tensor.is_complex()):
        if tensor.dtype != torch.int64 or not tensor.is_cpu or not tensor.is_contiguous():
            return tensor.detach().to("cpu", torch.int64).contiguous()
    if tensor.dtype in _HALF:
        return tensor.detach().to("cpu", torch.float32).contiguous()
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return tensor.detach().to("cpu").contiguous()
    return tensor.detach().clone() if stage else tensor.detach()


class ReduceBuffer:
    """The host buffer of one reduced tensor: :meth:`start` gives the array MPI reduces (once the
    ranks agreed: it may rewrite the tensor's own memory), :meth:`finish` once MPI is done with
    it (``write``: whether the result goes into the tensor). ``stage``: reduce a copy even where
    the tensor's own memory would do (it shares memory with another buffer of the operation)."""

    __slots__ = ("tensor", "host", "array", "red", "divisor", "ordered")

    def __init__(self, tensor: torch.Tensor, red: Reduction, divisor: int = 0, stage=False):
        self.tensor, self.red, self.divisor = tensor, red, divisor if red.average else 0
        self.host = _host(tensor, wide=red.average, stage=stage)
        self.array = self.host.reshape(-1).numpy()
        self.ordered = red.ordered(self.host)

    def start(self):
        """The array MPI reduces: the floats as the integers of their total order for ``min`` and
        ``max``."""
        if self.ordered:
            self.array = to_ordered(self.array, self.red.name)
        return self.array

    def finish(self, write: bool = True) -> None:
        """Undo the order mapping, divide for ``avg`` (integers floor, as ``//``), then write the
        result back where needed."""
        if self.ordered:
            from_ordered(self.array, self.red.name)
        host = self.host
        if self.divisor > 1 and write:
            if host.is_floating_point() or host.is_complex():
                host.div_(self.divisor)
            else:
                host.floor_divide_(self.divisor)
        if write and host.data_ptr() != self.tensor.data_ptr():
            with torch.no_grad():
                self.tensor.copy_(host)


class Scratch:
    """Receive buffers reused from one operation to the next: a fresh large buffer costs a page
    fault on every page MPI first writes. At most ``limit`` bytes are kept for reuse."""

    def __init__(self, limit: int = 256 << 20):
        self._lock = _threading.Lock()
        self._free: dict = {}  # (dtype, shape) -> arrays not in use
        self._kept, self._limit = 0, limit

    def take(self, like: _np.ndarray) -> _np.ndarray:
        """An array shaped and typed as ``like`` (contents undefined)."""
        with self._lock:
            free = self._free.get((like.dtype, like.shape))
            if free:
                array = free.pop()
                self._kept -= array.nbytes
                return array
        return _np.empty_like(like)

    def give(self, array: _np.ndarray) -> None:
        """Hand ``array`` back, once MPI is done with it."""
        with self._lock:
            if self._kept + array.nbytes <= self._limit:
                self._free.setdefault((array.dtype, array.shape), []).append(array)
                self._kept += array.nbytes


#: The process's scratch buffers (every group's operations share them).
SCRATCH = Scratch()
