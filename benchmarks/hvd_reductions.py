"""``mpisync.horovod``'s reducescatter and allreduce beside MPI's own calls and the limit rows.

    mpiexec -n 2 python benchmarks/hvd_reductions.py [--iterations 15] [--sizes 4 25]

Rows per size (MiB of float32 in each rank's input tensor, rows of 1000 values, as many rows for
every rank; medians of the slowest rank's time, the inputs rewritten before each call, the rows
interleaved in an order shuffled each iteration,
:func:`mpisync.tools.bench.timing.measure_interleaved`; rank 0 prints):

- ``hvd.reducescatter`` (``op=Sum``): on one node, from
  ``mpisync.transports.crossreduce.MIN_BYTES``, each rank reads its block of its peers' tensors
  by cross-memory; ``MPI_Reduce_scatter_block`` of a numpy array of the same bytes;
- ``hvd.allreduce`` (``op=Sum``, a new tensor) and ``MPI_Allreduce`` in place on a numpy array
  of the same bytes;
- ``hvd.grouped_allreduce`` (``op=Sum``) of the same bytes as 100 tensors, and
  ``mpisync.GradSync.allreduce`` of those tensors (in place, fused: the form
  ``DistributedOptimizer`` uses);
- ``limit``: each operation's least work as local copies and adds on every rank at once
  (``mpisync.tools.bench.limits``).

Run it from two checkouts in turn (``PYTHONPATH``) to compare them.
"""

from __future__ import annotations

import argparse


def _rows(comm, hvd, mib: float, iterations: int) -> dict:
    import numpy as np
    import torch
    from mpi4py import MPI

    import mpisync
    from mpisync.tools.bench.limits import limit_run
    from mpisync.tools.bench.timing import measure_interleaved

    size = comm.size
    n = int(mib * (1 << 20)) // 4 // (1000 * size) * (1000 * size)
    tensor, array = torch.ones(n // 1000, 1000), np.ones(n, np.float32)
    block = np.empty(n // size, np.float32)
    pieces = [torch.ones(n // 100) for _ in range(100)]
    grads = {f"g{i:03d}": p.numpy() for i, p in enumerate(pieces)}
    reducer = mpisync.GradSync(comm)
    runs = {
        "hvd.reducescatter": lambda: hvd.reducescatter(tensor, op=hvd.Sum),
        "MPI_Reduce_scatter_block": lambda: comm.Reduce_scatter_block(array, block),
        "limit, reduce-scatter": limit_run(comm, "reduce-scatter", 4 * n),
        "hvd.allreduce": lambda: hvd.allreduce(tensor, op=hvd.Sum),
        "MPI_Allreduce": lambda: comm.Allreduce(MPI.IN_PLACE, array),
        "hvd.grouped_allreduce, 100": lambda: hvd.grouped_allreduce(pieces, op=hvd.Sum),
        "GradSync, the same 100": lambda: reducer.allreduce(grads),
        "limit, all-reduce": limit_run(comm, "all-reduce", 4 * n),
    }

    def rewrite(name: str) -> None:
        tensor.fill_(1.0)
        array.fill(1.0)
        for piece in pieces:
            piece.fill_(1.0)

    timings = measure_interleaved(comm, runs, iterations=iterations, warmup=2, before=rewrite)
    reducer.close()
    return {name: t.median * 1e3 for name, t in timings.items()}


def main(argv=None) -> int:
    """Time the rows; rank 0 prints them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--sizes", type=float, nargs="+", default=[4, 25])
    args = parser.parse_args(argv)

    from mpi4py import MPI

    import mpisync.horovod as hvd

    comm = MPI.COMM_WORLD
    hvd.init(comm)
    if comm.rank == 0:
        print(f"{comm.size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(f"ms: medians of {args.iterations} calls (slowest rank)")
        print(f"  {'MiB':>5}  {'row':26s} {'ms':>8} {'of limit':>9}")
    for mib in args.sizes:
        rows = _rows(comm, hvd, mib, args.iterations)
        for name, ms in rows.items() if comm.rank == 0 else ():
            kind = "reduce-scatter" if "scatter" in name else "all-reduce"
            print(f"  {mib:5g}  {name:26s} {ms:8.3f} {rows[f'limit, {kind}'] / ms:9.2f}")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
