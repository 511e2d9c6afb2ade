"""Reduction operations and dtypes for :func:`mpisync.allreduce`: which MPI op, which numpy
ufunc for the local reduction, and how half-precision values are reduced.

MPI has no 16-bit float datatype that every library offers (and numpy has no
bfloat16 at all), so ``float16`` and ``bfloat16`` are reduced in ``float32``
staging buffers: widened exactly, reduced, then rounded once (to nearest,
ties to even) on the way back. ``avg`` is a sum divided by the number of
replicas over all ranks; for integer dtypes the division floors (as torch's
``//``), and integers narrower than 64 bits are summed in ``int64`` staging
buffers, so that the sum cannot overflow the dtype before the division. ``bool`` is refused;
complex dtypes take ``sum``, ``avg`` and
``prod`` only (no ordering for ``min``/``max``).

``min`` and ``max`` of floating-point values follow numpy's and torch's rule,
NaN wins, and every rank ends with the same bytes whatever path a value takes
(MPI or cross-memory, first call or reused): MPI's ``MIN``/``MAX`` leave
NaN to the library (MPICH's ``a < b ? a : b`` keeps a rank-dependent operand),
so floats are reduced as integers of a total order instead (:func:`to_ordered`):
the bits of a non-negative float read as a signed integer already sort as the
float does; a negative float's magnitude bits are flipped; NaNs are made to
sort above ``+inf`` (``max``) or below ``-inf`` (``min``). Integer ``MIN`` and
``MAX`` are exact, so the result is one total order's minimum or maximum on
every rank and channel; :func:`from_ordered` undoes the mapping.
"""

from __future__ import annotations

import numpy as _np
from mpi4py import MPI

__all__ = [
    "OPS",
    "check",
    "reduce_dtype",
    "itemsize",
    "mpi_op",
    "local_op",
    "is_staged",
    "widen",
    "narrow_into",
    "divide",
    "ordered_dtype",
    "to_ordered",
    "from_ordered",
]

OPS = ("sum", "avg", "min", "max", "prod")

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "min": MPI.MIN, "max": MPI.MAX, "prod": MPI.PROD}
_LOCAL_OPS = {
    "sum": _np.add,
    "avg": _np.add,
    "min": _np.minimum,
    "max": _np.maximum,
    "prod": _np.multiply,
}
_STAGED = ("float16", "bfloat16")
_NUMERIC = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float32",
    "float64",
    "complex64",
    "complex128",
) + _STAGED


def check(dtype: str, op: str) -> str | None:
    """Why ``dtype`` (a dtype name as :mod:`mpisync.params.adapters` spells it) cannot be reduced
    with ``op``, or ``None``."""
    if dtype not in _NUMERIC:
        return f"dtype {dtype} cannot be all-reduced (supported: {', '.join(_NUMERIC)})"
    if dtype.startswith("complex") and op in ("min", "max"):
        return f"op {op!r} is not defined for complex dtype {dtype}"
    return None


_WIDENED_FOR_AVG = ("int8", "int16", "int32", "uint8", "uint16", "uint32")


def is_staged(dtype: str, op: str = "sum") -> bool:
    """Whether ``dtype`` is reduced with ``op`` in a staging buffer of another dtype
    (:func:`reduce_dtype`)."""
    return dtype in _STAGED or (op == "avg" and dtype in _WIDENED_FOR_AVG)


def reduce_dtype(dtype: str, op: str = "sum") -> _np.dtype:
    """The numpy dtype MPI reduces ``dtype`` in with ``op``."""
    if dtype in _STAGED:
        return _np.dtype(_np.float32)
    return _np.dtype(_np.int64) if op == "avg" and dtype in _WIDENED_FOR_AVG else _np.dtype(dtype)


def itemsize(dtype: str) -> int:
    """Bytes per value of ``dtype`` (``bfloat16`` included)."""
    return 2 if dtype in _STAGED else _np.dtype(dtype).itemsize


def mpi_op(op: str):
    """The MPI operation for ``op`` (``avg`` sums; the caller divides)."""
    return _MPI_OPS[op]


def local_op(op: str):
    """The numpy ufunc that combines two replicas for ``op``."""
    return _LOCAL_OPS[op]


def widen(raw, dtype: str, out: _np.ndarray | None = None) -> _np.ndarray:
    """The values of the bytes ``raw`` in their staging dtype (exact): ``float32`` for half
    precision, ``int64`` for integers; into ``out`` if given."""
    if dtype not in _STAGED:
        values = _np.frombuffer(raw, dtype)
        if out is None:
            return values.astype(_np.int64)
        out[...] = values
        return out
    if dtype == "float16":
        half = _np.frombuffer(raw, _np.float16)
        if out is None:
            return half.astype(_np.float32)
        out[...] = half
        return out
    bits = _np.frombuffer(raw, _np.uint16).astype(_np.uint32) << 16
    if out is None:
        return bits.view(_np.float32)
    out.view(_np.uint32)[...] = bits
    return out


def narrow_into(raw, values: _np.ndarray, dtype: str) -> None:
    """Round staged ``values`` to ``dtype`` (half precision: nearest, ties to even; integers: values
    already in range after ``avg``'s division) into the bytes ``raw``."""
    if dtype not in _STAGED:
        _np.frombuffer(raw, dtype)[...] = values
        return
    if dtype == "float16":
        _np.frombuffer(raw, _np.float16)[...] = values
        return
    bits = values.view(_np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(_np.uint16)
    nan = _np.isnan(values)
    if nan.any():  # keep NaN a NaN (rounding could carry it into infinity)
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(_np.uint16)
    _np.frombuffer(raw, _np.uint16)[...] = rounded


def divide(values: _np.ndarray, count: int) -> None:
    """``values /= count`` in place; integer dtypes floor (as torch's ``//``)."""
    if count == 1:
        return
    if values.dtype.kind in "iu":
        _np.floor_divide(values, count, out=values)
    else:
        _np.divide(values, values.dtype.type(count), out=values)


_ORDERED = {2: _np.int16, 4: _np.int32, 8: _np.int64}


def ordered_dtype(dtype: _np.dtype, op: str) -> _np.dtype | None:
    """The integer dtype a buffer of ``dtype`` is reduced as with ``op`` (see :func:`to_ordered`),
    or None when it is reduced as it is (not ``min``/``max``, or not floating point)."""
    if op not in ("min", "max") or dtype.kind != "f":
        return None
    return _np.dtype(_ORDERED[dtype.itemsize])


def to_ordered(values: _np.ndarray, op: str) -> _np.ndarray:
    """Map the floats ``values`` in place to integers whose order is the floats' total order with
    NaN last (``max``) or first (``min``); return the integer view. Undone by
    :func:`from_ordered`."""
    bits = values.view(_ORDERED[values.itemsize])
    top = _np.iinfo(bits.dtype).min  # the sign bit
    nan = _np.isnan(values)
    if nan.any():
        if op == "max":
            bits[nan] &= ~top  # positive NaN: above +inf
        else:
            bits[nan] |= top  # negative NaN: below -inf once flipped
    _flip_negatives(bits)
    return bits


def from_ordered(bits: _np.ndarray, op: str) -> None:
    """Undo :func:`to_ordered` in place on the integer view ``bits``; NaN results are positive."""
    _flip_negatives(bits)
    if op == "min":
        values = bits.view(_np.dtype(f"f{bits.itemsize}"))
        nan = _np.isnan(values)
        if nan.any():
            bits[nan] &= ~_np.iinfo(bits.dtype).min


def _flip_negatives(bits: _np.ndarray) -> None:
    # x ^ ((x >> width-1) & max): negative words get their magnitude bits flipped (an involution)
    info = _np.iinfo(bits.dtype)
    _np.bitwise_xor(bits, (bits >> (8 * bits.itemsize - 1)) & info.max, out=bits)
