"""Whether ``mpisync.horovod``'s asynchronous all-reduce overlaps with the caller's work.

    mpiexec -n 2 python benchmarks/hvd_overlap.py [--iterations 15] [--megabytes 25] [--work-ms 20]

Three rows, interleaved, medians of the slowest rank's time: a blocking ``hvd.allreduce`` of a
float32 tensor; ``allreduce_async``, then ``--work-ms`` of work that leaves the core free
(``time.sleep``, as a GPU kernel or I/O would), then ``synchronize``; the blocking all-reduce
followed by the same work. Overlapped, the second row takes the longer of the two, not their
sum. Rank 0 prints the rows and the load average.
"""

from __future__ import annotations

import argparse
import sys
import time

from hvd_optimizer import print_rows  # this folder's script (on sys.path when run)


def main(argv=None) -> int:
    """Time the three rows; rank 0 prints them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--megabytes", type=int, default=25, help="MiB of float32 per rank")
    parser.add_argument("--work-ms", type=float, default=20.0)
    args = parser.parse_args(argv)

    import torch
    from mpi4py import MPI

    import mpisync.horovod as hvd
    from mpisync.tools.bench.timing import measure_interleaved

    comm = MPI.COMM_WORLD
    hvd.init(comm)
    tensor = torch.ones(args.megabytes << 18)
    work = args.work_ms / 1e3

    def overlapped() -> None:
        handle = hvd.allreduce_async(tensor, name="overlapped", op=hvd.Sum)
        time.sleep(work)
        hvd.synchronize(handle)

    def sequential() -> None:
        hvd.allreduce(tensor, name="sequential", op=hvd.Sum)
        time.sleep(work)

    runs = {
        "allreduce alone": lambda: hvd.allreduce(tensor, name="alone", op=hvd.Sum),
        "allreduce_async, work, synchronize": overlapped,
        "allreduce, then work": sequential,
    }
    timings = measure_interleaved(comm, runs, iterations=args.iterations, warmup=3)
    if comm.rank == 0:
        what = f"{args.megabytes} MiB float32, {args.work_ms:g} ms of work"
        print_rows(what, comm.size, args.iterations, timings)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
