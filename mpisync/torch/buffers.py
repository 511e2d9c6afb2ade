"""Host buffers MPI reads and writes for torch tensors, and what to copy back afterwards.

A contiguous CPU tensor is used in place. Anything else (a CUDA tensor, a
non-contiguous view) goes through a host copy that is written back when the
operation completes. Reductions of ``float16``/``bfloat16`` (which MPI and
numpy cannot reduce) run in ``float32`` copies, rounded once on the way back.
``avg`` of an integer tensor sums in an ``int64`` copy, so that the sum cannot
overflow the tensor's dtype before the (floor) division.
"""

from __future__ import annotations

import numpy as _np
import torch
from mpi4py import MPI

__all__ = [
    "ReduceBuffer",
    "byte_view",
    "check_reducible",
    "in_place_array",
    "mpi_reduce_op",
    "reduced",
]

_HALF = (torch.float16, torch.bfloat16)
_REFUSED = (torch.bool,)


_MPI_OPS: dict = {}


def mpi_reduce_op(op) -> tuple:
    """``(MPI op, average)`` for a ``torch.distributed.ReduceOp``; ``ValueError`` for the others."""
    kind = getattr(op, "op", op)  # a ReduceOp wraps its RedOpType (hashable)
    found = _MPI_OPS.get(kind)
    if found is None:
        from torch.distributed import ReduceOp

        table = {
            ReduceOp.SUM: MPI.SUM,
            ReduceOp.AVG: MPI.SUM,
            ReduceOp.PRODUCT: MPI.PROD,
            ReduceOp.MIN: MPI.MIN,
            ReduceOp.MAX: MPI.MAX,
            ReduceOp.BAND: MPI.BAND,
            ReduceOp.BOR: MPI.BOR,
            ReduceOp.BXOR: MPI.BXOR,
        }
        if kind not in table:
            raise ValueError(f"mpisync backend: reduce op {op} is not supported")
        found = _MPI_OPS[kind] = (table[kind], kind == ReduceOp.AVG)
    return found


def check_reducible(mpi_op, tensors) -> None:
    """``ValueError`` if ``mpi_op`` is not defined for one of ``tensors`` (checked before anything
    is posted)."""
    for tensor in tensors:
        if tensor.dtype in _REFUSED:
            raise ValueError(f"mpisync backend: cannot reduce a {tensor.dtype} tensor")
        if mpi_op in (MPI.BAND, MPI.BOR, MPI.BXOR) and (
            tensor.is_floating_point() or tensor.is_complex()
        ):
            raise ValueError(
                f"mpisync backend: bitwise reductions need integer tensors, got {tensor.dtype}"
            )
        if mpi_op in (MPI.MIN, MPI.MAX) and tensor.is_complex():
            raise ValueError(
                f"mpisync backend: min/max are not defined for complex tensors ({tensor.dtype})"
            )


# Dtypes MPI reduces as they are, in the tensor's own memory (numpy and MPI know them).
_IN_PLACE = frozenset(
    (torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
)


def in_place_array(tensor: torch.Tensor, mpi_op):
    """The numpy view MPI reduces ``tensor`` through in place with ``mpi_op`` (no copy, nothing to
    do afterwards), or None when it needs :class:`ReduceBuffer` (or must be refused)."""
    if tensor.dtype not in _IN_PLACE or not tensor.is_cpu or not tensor.is_contiguous():
        return None
    if tensor.is_floating_point() and mpi_op in (MPI.BAND, MPI.BOR, MPI.BXOR):
        return None  # refused by check_reducible
    tensor = tensor.detach()
    return tensor.numpy() if tensor.dim() else tensor.reshape(1).numpy()


def byte_view(tensor: torch.Tensor) -> _np.ndarray:
    """The bytes of a contiguous CPU tensor, as a writable numpy uint8 array (no copy)."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def reduced(tensor: torch.Tensor, wide: bool = False) -> torch.Tensor:
    """The CPU tensor MPI reduces for ``tensor``: itself when possible, else a (float32) host copy;
    ``wide``: integers in an ``int64`` copy (for ``avg``)."""
    if tensor.dtype in _REFUSED:
        raise ValueError(f"mpisync backend: cannot reduce a {tensor.dtype} tensor")
    if (
        wide
        and not (tensor.is_floating_point() or tensor.is_complex())
        and tensor.dtype != torch.int64
    ):
        return tensor.detach().to("cpu", torch.int64).contiguous()
    if tensor.dtype in _HALF:
        return tensor.detach().to("cpu", torch.float32).contiguous()
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        return tensor.detach().to("cpu").contiguous()
    return tensor.detach()


class ReduceBuffer:
    """The host buffer of one reduced tensor: ``array`` for MPI, ``finish()`` once it holds the
    result."""

    __slots__ = ("tensor", "host", "array", "average")

    def __init__(self, tensor: torch.Tensor, average: int = 0, wide: bool = False):
        self.tensor = tensor
        self.host = reduced(tensor, wide)
        self.array = self.host.numpy() if self.host.dim() else self.host.reshape(1).numpy()
        self.average = average  # divide by this many ranks after the sum (0: no division)

    def finish(self) -> None:
        """Divide for ``avg`` (integers floor, as ``//``), then write the result back where
        needed."""
        host = self.host
        if self.average > 1:
            if host.is_floating_point() or host.is_complex():
                host.div_(self.average)
            else:
                host.floor_divide_(self.average)
        if host.data_ptr() != self.tensor.data_ptr():
            with torch.no_grad():
                self.tensor.copy_(host)
