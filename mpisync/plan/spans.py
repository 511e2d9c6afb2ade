"""Parameters that sit end to end in memory travel as one span, without packing.

Models that keep their parameters in one flat buffer (views into it, in any
order) then cost one broadcast of the whole buffer instead of one per tensor
plus fusion copies. Ranks may lay memory out differently, so a span is used
only when every rank has the same runs: the layout digest rides in the
validation all-reduce, and the plan falls back to per-tensor transfers when
digests differ.
"""

from __future__ import annotations

import hashlib as _hashlib
import typing as _typing

from mpi4py import MPI

__all__ = ["Layout", "host_layout", "span_buffer", "NO_RUNS"]


class Layout(_typing.NamedTuple):
    """``runs``: tuples of parameter indices whose masters are adjacent, in address order."""

    runs: tuple
    digest: bytes  # 8 bytes, equal on ranks with equal runs


def _digest(runs: tuple) -> bytes:
    return _hashlib.blake2b(repr(runs).encode(), digest_size=8).digest()


NO_RUNS = Layout((), _digest(()))


def _may_share_a_buffer(view) -> bool:
    # A numpy array that owns its memory (base is None) is its own allocation, with the
    # allocator's bookkeeping around it, so it is never end to end with another parameter;
    # skipping it saves an address lookup per tensor on cold syncs of ordinary models.
    return getattr(getattr(view, "obj", None), "base", True) is not None


def host_layout(params: list) -> Layout:
    """The runs (two or more parameters, end to end) among ``params``' host masters."""
    placed = sorted(
        (MPI.Get_address(p.master.data), p.nbytes, i)
        for i, p in enumerate(params)
        if p.nbytes and _may_share_a_buffer(p.master.data)
    )
    runs: list[tuple[int, ...]]
    run: list[int]
    runs, run, end = [], [], None
    for address, nbytes, index in placed:
        if address != end and len(run) > 1:
            runs.append(tuple(run))
        if address != end:
            run = []
        run.append(index)
        end = address + nbytes
    if len(run) > 1:
        runs.append(tuple(run))
    runs.sort()  # a canonical order, so equal layouts give equal digests
    return Layout(tuple(runs), _digest(tuple(runs))) if runs else NO_RUNS


def span_buffer(first, start: int, nbytes: int):
    """``nbytes`` of memory from ``start`` bytes past the byte view ``first`` (a run's lowest
    master).

    The memory belongs to the run's arrays, which the caller keeps alive.
    """
    return MPI.buffer.fromaddress(MPI.Get_address(first) + start, nbytes, readonly=False)
