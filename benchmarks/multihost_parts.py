"""Where a steady sync of 5000 x 400 B goes across hosts: its parts timed side by side.

    bash ci/multihost.sh 2 2 --run python benchmarks/multihost_parts.py

Rows (medians of the slowest rank, interleaved in a shuffled order): one flat ``Bcast`` of the
2 MB; the 8 ``Ibcast``s of 256 KiB that mpisync's plan issues for it, through a ``RequestRing``
of 16 and with ``Waitall``; one 32-byte ``Allreduce`` (the size of the agreement a repeated sync
runs before its data), then the Ibcasts, or in flight with them (``Iallreduce``: what a sync that
overlapped its agreement with its data could take); and ``ParamSync`` steady state (and with
``timeout=0``, which waits inside
MPI instead of polling).
"""

from __future__ import annotations

import random
import statistics
import sys

import numpy as np
from mpi4py import MPI

import mpisync
from mpisync.tools.workloads import make_params, workload


def main(iterations: int = 25) -> int:
    """Time the parts; rank 0 prints them."""
    comm = MPI.COMM_WORLD
    params = make_params(workload("many-small"), comm.rank)
    flat = np.ones(sum(a.nbytes for a in params.values()), np.uint8)
    buckets = [np.ones(256 << 10, np.uint8) for _ in range(-(-flat.nbytes // (256 << 10)))]
    word = np.zeros(4, np.int64)

    def ring():
        requests = mpisync.RequestRing(16)
        for b in buckets:
            requests.push(comm.Ibcast(b, 0))
        requests.drain()

    syncers = {
        "ParamSync steady": mpisync.ParamSync(comm, root=0),
        "ParamSync steady, timeout=0": mpisync.ParamSync(comm, root=0, timeout=0),
    }
    for syncer in syncers.values():
        for _ in range(3):
            syncer.sync(params)
    runs = {
        "flat Bcast 2 MB": lambda: comm.Bcast(flat, 0),
        f"{len(buckets)} x 256 KiB Ibcast, ring of 16": ring,
        f"{len(buckets)} x 256 KiB Ibcast, Waitall": lambda: MPI.Request.Waitall(
            [comm.Ibcast(b, 0) for b in buckets]
        ),
        "Allreduce 32 B": lambda: comm.Allreduce(MPI.IN_PLACE, word, op=MPI.MAX),
        "Allreduce 32 B, then the Ibcasts": lambda: (
            comm.Allreduce(MPI.IN_PLACE, word, op=MPI.MAX),
            ring(),
        ),
        "Iallreduce 32 B with the Ibcasts": lambda: MPI.Request.Waitall(
            [comm.Iallreduce(MPI.IN_PLACE, word, op=MPI.MAX)] + [comm.Ibcast(b, 0) for b in buckets]
        ),
    }
    runs.update({name: (lambda s=s: s.sync(params)) for name, s in syncers.items()})
    samples = {name: [] for name in runs}
    for i in range(iterations):
        order = list(runs)
        random.Random(i).shuffle(order)
        for name in order:
            comm.Barrier()
            start = MPI.Wtime()
            runs[name]()
            samples[name].append(MPI.Wtime() - start)
    for name, values in samples.items():
        slowest = np.array(values)
        comm.Allreduce(MPI.IN_PLACE, slowest, op=MPI.MAX)
        if comm.rank == 0:
            print(f"{name:34} {statistics.median(slowest) * 1e3:8.2f} ms", flush=True)
    for syncer in syncers.values():
        syncer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
