"""Collective timing: barrier, warm-up, then per-iteration time, the slowest rank's."""

from __future__ import annotations

import dataclasses as _dc
import random as _random
import statistics as _statistics
import typing as _typing

import numpy as _np
from mpi4py import MPI

__all__ = ["Timing", "measure", "measure_interleaved"]


@_dc.dataclass
class Timing:
    """Seconds per iteration, each sample being the slowest rank's time for that iteration."""

    samples: list

    @property
    def median(self) -> float:
        """The median sample: what tables and ratios use (robust on a shared machine)."""
        return _statistics.median(self.samples)

    @property
    def best(self) -> float:
        """The fastest sample."""
        return min(self.samples)

    @property
    def worst(self) -> float:
        """The slowest sample."""
        return max(self.samples)

    def spread(self) -> dict:
        """``{"min_s", "max_s", "samples_s"}``: what a row of the JSON carries beside its
        median, so a reader can tell a steady row from a noisy one."""
        return {"min_s": self.best, "max_s": self.worst, "samples_s": list(self.samples)}


def _time_once(comm, fn) -> float:
    comm.Barrier()
    start = MPI.Wtime()
    fn()
    return MPI.Wtime() - start


def _slowest(comm, samples: list) -> list:
    slowest = _np.array(samples, dtype=_np.float64)
    comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
    return slowest.tolist()


def measure(comm, fn, *, iterations: int, warmup: int) -> Timing:
    """Run ``fn()`` ``warmup`` times, then time ``iterations`` runs (``MPI.Wtime``, barrier before
    each)."""
    return measure_interleaved(comm, {"fn": fn}, iterations=iterations, warmup=warmup)["fn"]


def measure_interleaved(
    comm,
    runs: dict,
    *,
    iterations: int,
    warmup: int,
    progress=None,
    before: _typing.Callable[[_typing.Any], object] | None = None,
) -> dict:
    """Time every ``runs[name]()`` side by side: each iteration runs each once, in a shuffled order.

    Load that comes and goes then lands on every strategy alike, not on one
    only, so ratios of medians compare like with like. The order is
    shuffled (the same on every rank: seeded by the iteration) rather than
    rotated: rotated, each run always followed the same neighbour, so what
    that neighbour left in the caches favoured or hurt it in every iteration.
    ``before(name)``, untimed, runs before each run of ``runs[name]`` (warm-up
    included): a training step's rewrite of that run's inputs, so no run finds
    its bytes in cache from the run before it.
    """
    names = list(runs)
    for _ in range(warmup):
        for name in names:
            if before is not None:
                before(name)
            _time_once(comm, runs[name])
    samples: dict[object, list[float]] = {name: [] for name in names}
    for i in range(iterations):
        order = list(names)
        _random.Random(i).shuffle(order)
        for name in order:
            if before is not None:
                before(name)
            samples[name].append(_time_once(comm, runs[name]))
        if progress is not None:
            progress()
    return {name: Timing(_slowest(comm, samples[name])) for name in names}
