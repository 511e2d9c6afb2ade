"""Buffers the bench times: every page written by the process that owns it.

A fresh ``np.zeros`` of more than a few pages is mapped to the kernel's one
zero page until it is written: a broadcast from it reads one cached page
over and over, and a receiver's first write into it takes a page fault, so
neither side moves the bytes a real buffer would. Every buffer the bench
times is made here: allocated, then filled, so each page is the process's
own before the first timed iteration (as OSU's ``set_buffer`` does).
"""

from __future__ import annotations

import numpy as _np

__all__ = ["written", "written_like"]


def written(count: int, dtype=_np.uint8, value=0) -> _np.ndarray:
    """A new array of ``count`` elements of ``dtype``, every page written with ``value``.

    ``value=0`` (the default) keeps sums of repeated reductions at zero (no
    overflow, no denormals) while every page is still this process's own."""
    array = _np.empty(max(0, int(count)), dtype=dtype)
    array.fill(value)
    return array


def written_like(array: _np.ndarray, value=0) -> _np.ndarray:
    """A new array of ``array``'s shape and dtype, every page written with ``value``."""
    out = _np.empty_like(array)
    out.fill(value)
    return out
