"""OSU-style broadcast latency sweep and Ibcast overlap (the methods of osu_bcast and osu_ibcast).

For each power-of-two size: ``skip`` warm-up iterations, then ``iterations``
timed ones (OSU's defaults: 200 + 1000 up to 8 KiB, 10 + 100 above), each
followed by a barrier; each rank's mean latency is reduced to min/avg/max.
Overlap follows osu_ibcast: ``100 - 100 * (t_total - t_compute) / t_pure``,
where ``t_pure`` is Ibcast+Wait alone and ``t_total`` is Ibcast, a dummy
computation as long as ``t_pure``, then Wait.
"""

from __future__ import annotations

import time as _time

import numpy as _np
from mpi4py import MPI

__all__ = ["bcast_sweep", "sizes_up_to"]

LARGE_MESSAGE = 8192


def sizes_up_to(max_bytes: int, min_bytes: int = 1) -> list:
    """Powers of two from ``min_bytes`` to ``max_bytes``."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def _counts(size: int, scale: float) -> tuple:
    iterations, skip = (1000, 200) if size <= LARGE_MESSAGE else (100, 10)
    return max(1, int(iterations * scale)), max(1, int(skip * scale))


def _mean_latency(comm, buf, root, iterations, skip, blocking: bool) -> float:
    total = 0.0
    for i in range(skip + iterations):
        start = MPI.Wtime()
        if blocking:
            comm.Bcast(buf, root)
        else:
            comm.Ibcast(buf, root).Wait()
        if i >= skip:
            total += MPI.Wtime() - start
        comm.Barrier()
    return total / iterations


def _busy(seconds: float) -> None:
    end = _time.perf_counter() + seconds
    while _time.perf_counter() < end:
        pass


def _overlap(comm, buf, root, iterations, skip, t_pure) -> float:
    total = compute = 0.0
    for i in range(skip + iterations):
        start = MPI.Wtime()
        request = comm.Ibcast(buf, root)
        c0 = MPI.Wtime()
        _busy(t_pure)
        c1 = MPI.Wtime()
        request.Wait()
        if i >= skip:
            total += MPI.Wtime() - start
            compute += c1 - c0
        comm.Barrier()
    total, compute = total / iterations, compute / iterations
    return max(0.0, 100.0 - 100.0 * (total - compute) / t_pure) if t_pure > 0 else 0.0


def _reduce(comm, value: float) -> tuple:
    mine = _np.array([value, -value, value], dtype=_np.float64)
    out = _np.empty_like(mine)
    comm.Allreduce(mine[:2], out[:2], op=MPI.MAX)
    comm.Allreduce(mine[2:], out[2:], op=MPI.SUM)
    return -out[1], out[2] / comm.size, out[0]


def bcast_sweep(
    comm, sizes, *, scale: float = 1.0, root: int = 0, overlap: bool = True, progress=None
) -> list:
    """One row per size: latency (us) min/avg/max of blocking Bcast, Ibcast's, and Ibcast overlap
    (%)."""
    rows = []
    for size in sizes:
        buf = _np.zeros(size, dtype=_np.uint8)
        iterations, skip = _counts(size, scale)
        lat = _mean_latency(comm, buf, root, iterations, skip, blocking=True)
        lo, avg, hi = _reduce(comm, lat)
        row = {
            "bytes": size,
            "lat_min_us": lo * 1e6,
            "lat_avg_us": avg * 1e6,
            "lat_max_us": hi * 1e6,
            "gbps": size / avg / 1e9 if avg > 0 else 0.0,
        }
        if overlap:
            pure = _mean_latency(comm, buf, root, iterations, skip, blocking=False)
            _, pure_avg, _ = _reduce(comm, pure)
            ov = _overlap(comm, buf, root, iterations, skip, pure)
            row["ibcast_avg_us"] = pure_avg * 1e6
            row["overlap_pct"] = _reduce(comm, ov)[1]
        rows.append(row)
        if progress is not None:
            progress()
    return rows
