"""Where the host masters sit in memory: parameters end to end travel as one span, without
packing; one region under two names (tied weights) travels once.

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
    """Where ``params``' host masters sit in memory.

    ``runs``: tuples of parameter indices whose masters are end to end, in
    address order. ``aliases``: ``(index, representative)`` pairs, a master
    that is exactly the memory of an earlier parameter's (tied weights: one
    tensor under two names); the representative is the first of them in
    ``params``' order. ``overlaps``: ``(index, other)`` pairs whose masters
    share some memory without being the same region.
    """

    runs: tuple
    digest: bytes  # 8 bytes, equal on ranks with equal runs and aliases
    aliases: tuple = ()
    overlaps: tuple = ()


def _digest(runs: tuple, aliases: tuple = ()) -> bytes:
    return _hashlib.blake2b(repr((runs, aliases)).encode(), digest_size=8).digest()


NO_RUNS = Layout((), _digest(()))


def host_layout(params: list) -> Layout:
    """The runs (two or more parameters, end to end), aliases and overlaps among ``params``' host
    masters (one address lookup per parameter)."""
    placed = sorted(
        (MPI.Get_address(p.master.data), p.nbytes, i) for i, p in enumerate(params) if p.nbytes
    )
    aliases: list[tuple[int, int]] = []
    overlaps: list[tuple[int, int]] = []
    distinct: list[tuple[int, int, int]] = []
    reach, widest = 0, -1  # the furthest end so far, and whose it is
    for address, nbytes, index in placed:
        if distinct and (address, nbytes) == distinct[-1][:2]:
            aliases.append((index, distinct[-1][2]))  # sorted by index within equal regions
            continue
        if address < reach:
            overlaps.append((index, widest))  # kept out of runs: a run's members lie end to end
        else:
            distinct.append((address, nbytes, index))
        if address + nbytes > reach:
            reach, widest = address + nbytes, index
    runs: list[tuple[int, ...]] = []
    run: list[int] = []
    end = None
    for address, nbytes, index in distinct:
        if address != end and len(run) > 1:
            runs.append(tuple(run))
        if address != end:
            run = []
        run.append(index)
        end = address + nbytes
    if len(run) > 1:
        runs.append(tuple(run))
    runs.sort()  # a canonical order, so equal layouts give equal digests
    aliases.sort()
    if not (runs or aliases or overlaps):
        return NO_RUNS
    return Layout(
        tuple(runs), _digest(tuple(runs), tuple(aliases)), tuple(aliases), tuple(overlaps)
    )


def span_buffer(first, start: int, nbytes: int):
    """``nbytes`` of memory from ``start`` bytes past the byte view ``first`` (a run's lowest
    master).

    The memory belongs to the run's arrays, which the caller keeps alive.
    """
    return MPI.buffer.fromaddress(MPI.Get_address(first) + start, nbytes, readonly=False)
