"""The Python form of every loop of ``mpisync._speedups``: the same functions, arguments, results
and errors, so a build without a C compiler (or ``MPISYNC_SPEEDUPS=0``) runs the same program.

:mod:`mpisync._runtime.speedups` picks, function by function, the C loop or this one. States
are the same int64 words in both (a dtype's word is its object's ``id``, the address C reads),
so a snapshot taken by one is compared by the other.
"""

from __future__ import annotations

import array as _array
import operator as _operator

import numpy as _np
from mpi4py import MPI as _MPI

__all__ = [
    "BufferList",
    "array_list",
    "array_states",
    "dict_version",
    "joined_names",
    "same_items",
    "same_states",
    "sorted_names",
]


def _bytes(item) -> memoryview:
    """``item``'s C-contiguous bytes (``BufferError`` otherwise), as a byte memoryview."""
    view = memoryview(item)
    if not view.c_contiguous:
        raise BufferError("memoryview: underlying buffer is not C-contiguous")
    try:
        return view.cast("B")
    except (
        TypeError,
        ValueError,
        NotImplementedError,
    ):  # a format the cast refuses (numpy's complex, records): numpy's own bytes
        # ignore[arg-type]: numpy's stubs declare ndarray's buffer protocol for Python >= 3.12 only
        return memoryview(_np.asarray(item).reshape(-1).view(_np.uint8))  # type: ignore[arg-type]


class BufferList:
    """C-contiguous buffers held for gather/scatter against one arena (``mpisync._speedups``'s
    ``BufferList``, as slice copies)."""

    compiled = False  # the arena copies it with the kernel or a Python loop (plan.arena)

    def __init__(self, buffers, exact_type=None, *, _parts=None):
        if _parts is not None:
            self.views, self._shapes = _parts
        else:
            items = list(buffers)
            if exact_type is not None:
                for i, item in enumerate(items):
                    if type(item) is not exact_type:
                        raise TypeError(
                            f"BufferList: item {i} is a {type(item).__name__}, not exactly a "
                            f"{exact_type.__name__}"
                        )
            self.views = [_bytes(item) for item in items]
            self._shapes = [tuple(memoryview(item).shape or ()) for item in items]
        self.nbytes = sum(map(_operator.attrgetter("nbytes"), self.views))
        self.readonly = any(map(_operator.attrgetter("readonly"), self.views))

    def __len__(self) -> int:
        return len(self.views)

    def _fits(self, arena: memoryview, offset: int) -> None:
        if offset < 0 or self.nbytes > len(arena) - offset:
            raise ValueError(
                f"BufferList: {self.nbytes} bytes do not fit at offset {offset} of {len(arena)}"
            )

    def gather(self, arena, offset: int = 0) -> int:
        """Copy every buffer, end to end, into ``arena`` from ``offset``."""
        arena = memoryview(arena).cast("B")
        self._fits(arena, offset)
        for view in self.views:
            end = offset + view.nbytes
            arena[offset:end] = view
            offset = end
        return self.nbytes

    def scatter(self, arena, offset: int = 0) -> int:
        """Fill every buffer, end to end, from ``arena`` at ``offset``."""
        if self.readonly:
            raise ValueError("BufferList.scatter: a buffer of the list is read-only")
        arena = memoryview(arena).cast("B")
        self._fits(arena, offset)
        for view in self.views:
            end = offset + view.nbytes
            view[:] = arena[offset:end]
            offset = end
        return self.nbytes

    def lengths(self) -> bytes:
        """Every buffer's length as native int64."""
        return _array.array("q", [v.nbytes for v in self.views]).tobytes()

    def addresses(self) -> bytes:
        """Every buffer's start address as native int64."""
        return _array.array("q", [_MPI.Get_address(v) for v in self.views]).tobytes()

    def shapes(self) -> bytes:
        """Per buffer, its ndim then its extents, as native int64 words."""
        if self._shapes is None:
            raise ValueError("BufferList.shapes: a part of an array_list() keeps no shapes")
        return _array.array("q", [w for s in self._shapes for w in (len(s), *s)]).tobytes()

    def part(self, first: int, last: int) -> BufferList:
        """Buffers ``first..last-1`` as a list of their own."""
        if first < 0 or last < first or last > len(self.views):
            raise IndexError(f"BufferList.part({first}, {last}) of {len(self.views)} buffers")
        return BufferList((), _parts=(self.views[first:last], None))


def _address(array) -> int:
    """The array's data address: MPI's lookup of its buffer (one export, far cheaper than
    ``__array_interface__``), numpy's own where the buffer is not contiguous."""
    try:
        return _MPI.Get_address(array)
    except (BufferError, TypeError, ValueError):
        return array.__array_interface__["data"][0]


def _states_into(words: list, items, array_type) -> None:
    extend = words.extend
    for item in items:
        if type(item) is not array_type:
            words.append(0)
            continue
        shape = item.shape
        extend((1 + len(shape), _address(item), id(item.dtype), 1 if item.flags.writeable else 0))
        for pair in zip(shape, item.strides):
            extend(pair)


def array_states(items, array_type) -> bytes:
    """Each exact ``array_type`` item's address, dtype, writability, shape and strides (one zero
    word for other items), as native int64 words."""
    _check_array_type(array_type)
    words: list = []
    _states_into(words, items, array_type)
    return _array.array("q", words).tobytes()


def same_states(items, array_type, states) -> bool:
    """``array_states(items, array_type) == states``."""
    return array_states(items, array_type) == bytes(states)


def array_list(items, array_type) -> tuple:
    """``(BufferList, dtype runs, states)`` of exact, C-contiguous ``array_type`` items."""
    _check_array_type(array_type)
    owners = tuple(items)
    views: list = []
    shapes: list = []
    runs: list = []
    for i, item in enumerate(owners):
        if type(item) is not array_type:
            raise TypeError(
                f"array_list: item {i} is a {type(item).__name__}, not exactly a "
                f"{array_type.__module__}.{array_type.__name__}"
            )
        try:
            views.append(_bytes(item))
        except BufferError:
            raise BufferError(f"array_list: item {i} is not C-contiguous") from None
        shapes.append(item.shape)
        if runs and runs[-1][0] is item.dtype:
            runs[-1][1] += 1
        else:
            runs.append([item.dtype, 1])
    held = BufferList((), _parts=(views, shapes))
    held.owners = owners  # type: ignore[attr-defined]  # as the C list, it holds the arrays
    words: list = []
    _states_into(words, owners, array_type)
    return held, runs, _array.array("q", words).tobytes()


def _check_array_type(array_type) -> None:
    if array_type is not _np.ndarray:
        raise TypeError("array_type must be numpy.ndarray")


def dict_version(mapping: dict) -> int:
    """-1: Python has no view of the dict's version tag (callers compare the entries)."""
    if not isinstance(mapping, dict):
        raise TypeError("dict_version() takes a dict")
    return -1


def same_items(mapping: dict, keys: tuple, values: tuple) -> bool:
    """Whether dict ``mapping`` holds exactly ``keys`` -> ``values``, in that order, by
    identity."""
    if not isinstance(mapping, dict):
        raise TypeError("same_items() takes a dict")
    return (
        len(mapping) == len(keys) == len(values)
        and all(map(_operator.is_, mapping, keys))
        and all(map(_operator.is_, mapping.values(), values))
    )


def sorted_names(mapping: dict):
    """``(sorted(mapping), whether the dict held its keys in that order)``; None when a key is not
    exactly a str."""
    if not isinstance(mapping, dict):
        raise TypeError("sorted_names() takes a dict")
    names = list(mapping)
    if not set(map(type, names)) <= {str}:
        return None
    in_order = all(map(_operator.lt, names, names[1:]))
    return (names if in_order else sorted(names)), in_order


def joined_names(items):
    """The UTF-8 of ``"\\0".join(items)``; None when an item is not a str, holds a NUL or does not
    encode (a lone surrogate)."""
    names = list(items)
    if any(not isinstance(name, str) or "\x00" in name for name in names):
        return None
    try:
        return "\x00".join(names).encode("utf-8")
    except UnicodeEncodeError:
        return None
