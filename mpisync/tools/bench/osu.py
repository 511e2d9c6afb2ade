"""Raw MPI rows by OSU's method: osu_bcast, osu_allreduce, osu_reduce, osu_allgather and
osu_ibcast's overlap.

For each power-of-two size (``MPI_CHAR`` bytes for Bcast and Allgather, each
rank's contribution for Allgather; ``MPI_FLOAT`` with ``MPI_SUM`` for
Allreduce and Reduce, from 4 B): ``skip`` warm-up iterations, then
``iterations`` timed ones (OSU's defaults: 200 + 1000 up to 8 KiB, 10 + 100
above, times ``scale``), each call timed alone with ``MPI_Wtime`` around it
and followed by a barrier; each rank's mean latency is reduced to the
min / avg / max across ranks. Buffers are written before the first call.

The loop runs in C (:mod:`mpisync.tools.bench._osuloop`, built with the
package where an MPI wheel put ``mpi.h`` beside Python) so that mpi4py's
per-call cost stays out of the figure. Without it the loop runs in Python and
each rank's mean is reduced by the mean of the same call on an empty message
on ``COMM_SELF`` (Python's and mpi4py's cost of a call, which MPI returns
from at once): :func:`method` says which.

OSU's programs call ``MPI_Init`` (``MPI_THREAD_SINGLE``); mpi4py asks for
``MPI_THREAD_MULTIPLE`` unless ``MPI4PY_RC_THREAD_LEVEL`` says otherwise, and an
MPI library may take a lock in every call at that level: the tables name the
level (:func:`mpisync._runtime.mpilib.thread_level`), and the same level is needed to
compare with OSU.

Overlap follows osu_ibcast: ``100 - 100 * (t_total - t_compute) / t_pure``,
where ``t_pure`` is Ibcast+Wait alone and ``t_total`` is Ibcast, a dummy
computation as long as ``t_pure``, then Wait (timed from Python, both).
"""

from __future__ import annotations

import time as _time

import numpy as _np
from mpi4py import MPI

from .buffers import written

__all__ = ["OPERATIONS", "method", "sweep", "bcast_sweep", "sizes_up_to", "counts"]

try:
    from . import _osuloop  # type: ignore[attr-defined]
except ImportError:  # not built: the Python loop, its call cost subtracted
    _osuloop = None

LARGE_MESSAGE = 8192
#: operation -> (the C loop's code, element bytes, smallest size)
OPERATIONS = {
    "bcast": (0, 1, 1),
    "allreduce": (1, 4, 4),
    "reduce": (2, 4, 4),
    "allgather": (3, 1, 1),
}


def method() -> str:
    """How the raw rows are timed here: OSU's loop in C, or in Python with its call cost
    subtracted."""
    return "C loop" if _osuloop is not None else "Python loop, call cost subtracted"


def sizes_up_to(max_bytes: int, min_bytes: int = 1) -> list:
    """Powers of two from ``min_bytes`` to ``max_bytes``."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= 2
    return out


def counts(size: int, scale: float) -> tuple:
    """``(iterations, skip)`` of OSU's defaults at ``size`` bytes, times ``scale`` (at least 1)."""
    iterations, skip = (1000, 200) if size <= LARGE_MESSAGE else (100, 10)
    return max(1, int(iterations * scale)), max(1, int(skip * scale))


def _buffers(op: str, size: int, ranks: int) -> tuple:
    if op == "bcast":
        buf = written(size, value=1)
        return buf, buf
    if op == "allgather":
        return written(size, value=1), written(size * ranks)
    return written(size // 4, _np.float32), written(size // 4, _np.float32)


def _python_call(op: str, comm, send, recv, root: int):
    if op == "bcast":
        return lambda: comm.Bcast([send, MPI.CHAR], root)
    if op == "allreduce":
        return lambda: comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], MPI.SUM)
    if op == "reduce":
        return lambda: comm.Reduce([send, MPI.FLOAT], [recv, MPI.FLOAT], MPI.SUM, root)
    return lambda: comm.Allgather([send, MPI.CHAR], [recv, MPI.CHAR])


def _python_loop(comm, call, iterations: int, skip: int) -> float:
    total = 0.0
    for i in range(skip + iterations):
        start = MPI.Wtime()
        call()
        stop = MPI.Wtime()
        if i >= skip:
            total += stop - start
        comm.Barrier()
    return total


def _call_cost(op: str, send, recv, iterations: int, skip: int) -> float:
    """Mean seconds of the same Python call on an empty message on ``COMM_SELF``."""
    call = _python_call(op, MPI.COMM_SELF, send[:0], recv[:0], 0)
    return _python_loop(MPI.COMM_SELF, call, iterations, skip) / iterations


def mean_latency(comm, op: str, size: int, iterations: int, skip: int, root: int = 0) -> float:
    """This rank's mean seconds per call of ``op`` on ``size`` bytes, by OSU's loop."""
    send, recv = _buffers(op, size, comm.size)
    count = size // OPERATIONS[op][1]
    if _osuloop is not None:
        total = _osuloop.osu_loop(
            OPERATIONS[op][0], comm.handle, send, recv, count, root, iterations, skip
        )
        return total / iterations
    total = _python_loop(comm, _python_call(op, comm, send, recv, root), iterations, skip)
    return max(0.0, total / iterations - _call_cost(op, send, recv, iterations, skip))


def _reduce(comm, value: float) -> tuple:
    mine = _np.array([value, -value, value], dtype=_np.float64)
    out = _np.empty_like(mine)
    comm.Allreduce(mine[:2], out[:2], op=MPI.MAX)
    comm.Allreduce(mine[2:], out[2:], op=MPI.SUM)
    return -out[1], out[2] / comm.size, out[0]


def sweep(comm, op: str, sizes, *, scale: float = 1.0, root: int = 0, progress=None) -> list:
    """One row per size of ``sizes`` (those below ``op``'s smallest left out): latency (us) min,
    avg and max across ranks of each rank's mean, and GB/s (size / avg)."""
    rows = []
    for size in [s for s in sizes if s >= OPERATIONS[op][2]]:
        iterations, skip = counts(size, scale)
        comm.Barrier()
        lo, avg, hi = _reduce(comm, mean_latency(comm, op, size, iterations, skip, root))
        rows.append(
            {
                "bytes": size,
                "iterations": iterations,
                "lat_min_us": lo * 1e6,
                "lat_avg_us": avg * 1e6,
                "lat_max_us": hi * 1e6,
                "gbps": size / avg / 1e9 if avg > 0 else 0.0,
            }
        )
        if progress is not None:
            progress()
    return rows


def _ibcast_latency(comm, buf, root, iterations, skip) -> float:
    call = lambda: comm.Ibcast(buf, root).Wait()  # noqa: E731
    return _python_loop(comm, call, iterations, skip) / iterations


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


def bcast_sweep(
    comm, sizes, *, scale: float = 1.0, root: int = 0, overlap: bool = True, progress=None
) -> list:
    """:func:`sweep` of Bcast, with (``overlap``) Ibcast+Wait's mean latency (us, avg across
    ranks) and osu_ibcast's overlap (%) at each size."""
    rows = sweep(comm, "bcast", sizes, scale=scale, root=root, progress=progress)
    if not overlap:
        return rows
    for row in rows:
        buf = written(row["bytes"], value=1)
        iterations, skip = counts(row["bytes"], scale)
        pure = _ibcast_latency(comm, buf, root, iterations, skip)
        row["ibcast_avg_us"] = _reduce(comm, pure)[1] * 1e6
        row["overlap_pct"] = _reduce(comm, _overlap(comm, buf, root, iterations, skip, pure))[1]
    return rows
