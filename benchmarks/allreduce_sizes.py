"""One large in-place ``Allreduce`` against the same bytes in sequential pieces, size by size.

    mpiexec -n 2 python benchmarks/allreduce_sizes.py [--sizes 16 32 36 48 64 96] [--piece 8]
    [--iterations 9]

Per size (MiB of float32): one ``Allreduce(IN_PLACE)`` of a fresh array, and the same array
reduced in ``--piece`` MiB pieces one after the other, timed side by side (medians of the
slowest rank). MPICH reduces into a temporary buffer as large as the message, taken from
``malloc`` on every call; where glibc serves that from fresh pages (at or above its mmap
threshold, which grows to 32 MiB by default), every call pays their page faults, and pieces
below the threshold do not. Run it once as it is and
once with ``-genv MALLOC_MMAP_THRESHOLD_ 2147483647 -genv MALLOC_TRIM_THRESHOLD_ 4294967296``
to see the allocator's share (docs/allreduce.md).
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    """Time both ways at each size; rank 0 prints them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[16, 32, 36, 48, 64, 96], help="MiB"
    )
    parser.add_argument("--piece", type=float, default=8, help="MiB per piece")
    parser.add_argument("--iterations", type=int, default=9)
    args = parser.parse_args(argv)

    import numpy as np
    from mpi4py import MPI

    from mpisync.tools.bench.timing import measure_interleaved

    comm = MPI.COMM_WORLD
    piece = max(1, int(args.piece * (1 << 20)) // 4)
    if comm.rank == 0:
        print(
            f"in-place Allreduce of float32, {comm.size} ranks, medians of {args.iterations} "
            "(slowest rank); "
            f"pieces of {piece * 4 / (1 << 20):g} MiB"
        )
    for mib in args.sizes:
        # written zeros (every page the process's own, not the zero page): sums stay exact
        values = np.full(max(1, int(mib * (1 << 20)) // 4), 0.0, np.float32)
        runs = {
            "one": lambda v=values: comm.Allreduce(MPI.IN_PLACE, v),
            "pieces": lambda v=values: [
                comm.Allreduce(MPI.IN_PLACE, v[i : i + piece]) for i in range(0, v.size, piece)
            ],
        }
        ms = {
            name: t.median * 1e3
            for name, t in measure_interleaved(
                comm, runs, iterations=args.iterations, warmup=2
            ).items()
        }
        if comm.rank == 0:
            gbps = values.nbytes / ms["one"] / 1e6
            print(
                f"  {mib:7g} MiB  one {ms['one']:8.2f} ms ({gbps:5.2f} GB/s)  pieces "
                f"{ms['pieces']:8.2f} ms"
                f"  one/pieces {ms['one'] / ms['pieces']:5.2f}",
                flush=True,
            )
        del values
    return 0


if __name__ == "__main__":
    sys.exit(main())
