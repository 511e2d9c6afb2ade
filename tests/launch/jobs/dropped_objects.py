"""Syncers dropped without ``close()``: ``python dropped_objects.py MODE [N]``, under mpiexec.

MODE ``drop``: N ``ParamSync`` objects, then N ``GradSync`` objects, each created, used and
dropped without ``close()`` (more than MPICH's 2048 communicator context ids). Rank 0 prints one
line per kind and rank: ``KIND rank R: fds A B maps C D rss E F`` (before and after: open file
descriptors, mappings of /dev/shm, resident KiB).

MODE ``exhausted``: the caller holds duplicates of ``COMM_WORLD`` until MPI has no context id
left; a ``ParamSync`` and a ``GradSync`` are called then (each must raise ``SyncError`` on every
rank), and again once the caller freed them (each must work). Rank 0 prints ``rank R: ...``.
"""

import gc
import os
import sys

import numpy as np
from mpi4py import MPI

import mpisync

mode = sys.argv[1]
comm = MPI.COMM_WORLD
# a few small tensors (fused) and one of 1 MiB: the arena, the node's paths, the communicator
params = {f"p{i}": np.full(1000 + i, comm.rank + 1.0, np.float32) for i in range(16)}
params["big"] = np.full(1 << 18, comm.rank + 1.0, np.float32)


def usage() -> tuple:
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    with open("/proc/self/maps") as maps:
        shm = sum("/dev/shm/" in line for line in maps)
    with open("/proc/self/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return fds, shm, rss


def use(kind: str) -> None:
    if kind == "ParamSync":
        mpisync.ParamSync(comm).sync(params)
    else:
        reducer = mpisync.GradSync(comm)
        for _ in range(3):  # the first call prepares, the later ones reuse
            reducer.allreduce(params)


def show(lines: list) -> None:
    said = comm.gather("\n".join(lines))
    if comm.rank == 0:  # one writer: the ranks' lines never interleave
        print("\n".join(said), flush=True)


if mode == "drop":
    n = int(sys.argv[2])
    lines = []
    for kind in ("ParamSync", "GradSync"):
        for _ in range(20):  # first-use costs (imports, pools, caches) before measuring
            use(kind)
        before = usage()
        for _ in range(n):
            use(kind)
        after = usage()
        lines.append(
            f"{kind} rank {comm.rank}: fds {before[0]} {after[0]} maps {before[1]} {after[1]} "
            f"rss {before[2]} {after[2]}"
        )
    show(lines)
else:
    syncer, reducer = mpisync.ParamSync(comm), mpisync.GradSync(comm)
    held = []
    try:
        while True:
            held.append(comm.Dup())
    except MPI.Exception:
        pass
    outcomes = []
    for name, call in (("sync", syncer.sync), ("allreduce", reducer.allreduce)):
        try:
            call(params)
            outcomes.append(f"{name}: no error")
        except mpisync.SyncError as exc:
            outcomes.append(f"{name}: {type(exc).__name__}: {exc}")
    for dup in held:
        dup.Free()
    syncer.sync(params)
    reducer.allreduce(params)
    right = bool((params["big"] == float(comm.size)).all())  # root's 1, then summed
    syncer.close()
    reducer.close()
    show([f"rank {comm.rank}: held {len(held)}; " + "; ".join(outcomes) + f"; after: {right}"])
