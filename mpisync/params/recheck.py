"""What a prepared sync relies on about each array, and a cheap check that it still holds.

A :class:`~mpisync.ParamSync` that gets the same array objects back reuses
its compiled copies, which hold addresses. Before each such sync every
array's data address, shape, strides, dtype and writability are compared
with what was prepared (one loop of :mod:`mpisync._runtime.speedups` over the numpy arrays, or
over the numpy views of torch CPU tensors when the bulk path prepared them; the rest one by
one). Any
difference makes the rank prepare again, and the validation exchange tells
every rank that someone did, so nothing is written at an address an array
no longer owns.
"""

from __future__ import annotations

import sys as _sys

import numpy as _np

from .._runtime.speedups import loops
from .adapters import torch_cpu_views

__all__ = ["snapshot", "unchanged"]


def _state(value) -> tuple:
    """One array's state as a tuple (torch tensors, cupy arrays: what the loops' words leave
    out)."""
    if isinstance(value, _np.ndarray):
        return (
            value.__array_interface__["data"][0],
            value.shape,
            value.strides,
            value.dtype,
            bool(value.flags.writeable),
        )
    torch = _sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return (
            value.data_ptr(),
            tuple(value.shape),
            tuple(value.stride()),
            value.dtype,
            value.device,
            value.layout,
            bool(value.is_conj()),
            bool(value.is_neg()),
            bool(getattr(value, "is_inference", lambda: False)()),
        )
    data = getattr(value, "data", None)
    pointer = getattr(data, "ptr", None)  # cupy
    return (
        type(value),
        pointer,
        getattr(value, "shape", None),
        getattr(value, "strides", None),
        getattr(value, "dtype", None),
    )


class Snapshot:
    """The states of ``values`` when they were prepared."""

    __slots__ = ("words", "others", "dtypes", "through_torch")

    def __init__(
        self, words: bytes | None, others: tuple, dtypes: tuple = (), through_torch: bool = False
    ):
        self.words = words  # the loops' words for exact numpy arrays (one zero word for others)
        self.others = others  # (index, state) for everything the C loop does not read
        # The C form compares dtypes by address: holding them keeps a new dtype from taking the
        # address.
        self.dtypes = dtypes
        # words of the torch tensors' numpy views (arrays.torch_cpu_views)
        self.through_torch = through_torch


def snapshot(
    values: tuple,
    *,
    dtypes: tuple | None = None,
    views: list | None = None,
    words: bytes | None = None,
) -> Snapshot:
    """Record each array's address, shape, strides, dtype and writability.

    ``dtypes``: every dtype object of the arrays recorded, held by the snapshot; given without
    ``views``, the caller knows every value is exactly a ``numpy.ndarray`` (the C loop reads them
    all); with ``views``, every value is a torch CPU tensor and ``views`` are its
    :func:`~mpisync.params.adapters.torch_cpu_views`, whose states are recorded (and compared, by C
    loop).
    ``words``: those states, already read (``mpisync._speedups.array_list`` gives them with the
    buffers), in the order of ``values``.
    """
    if dtypes is not None:
        if words is None:
            words = loops.array_states(values if views is None else views, _np.ndarray)
        return Snapshot(words, (), dtypes, views is not None)
    words = loops.array_states(values, _np.ndarray)
    others = tuple((i, _state(v)) for i, v in enumerate(values) if type(v) is not _np.ndarray)
    return Snapshot(words, others, tuple(getattr(v, "dtype", None) for v in values))


def unchanged(values: tuple, prepared: Snapshot | None) -> bool:
    """Whether every array of ``values`` still has the state recorded in ``prepared``.

    Never raises: anything unexpected counts as changed (the rank then prepares again, and the
    validation exchange, not this check, reports what is wrong), and so does no snapshot (None).
    """
    if prepared is None:
        return False
    try:
        if prepared.through_torch:
            views = torch_cpu_views(values)
            return views is not None and loops.same_states(views, _np.ndarray, prepared.words)
        if prepared.words is not None and not loops.same_states(
            values, _np.ndarray, prepared.words
        ):
            return False
        for i, state in prepared.others:
            if _state(values[i]) != state:
                return False
    except Exception:
        return False
    return True
