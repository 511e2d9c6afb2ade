"""The all-reduce of one array on one node, by the node's paths and through MPI, in one run.

    mpiexec -n 2 python benchmarks/node_allreduce.py [--rounds 30] [--sizes 8 25 64]

Rows per size (MiB of float32 per rank; each the median of ``--rounds`` calls of the slowest
rank, a barrier before each, the array rewritten before each call as a training step does;
the rows interleaved round by round, in an order shuffled each round (the same on every rank),
so a change in the machine's state, and what ran just before, touch them alike; rank 0 prints):

- ``MPI_Allreduce``: mpi4py's in-place all-reduce of the same array, no mpisync code;
- ``GradSync``: ``mpisync.GradSync.allreduce`` of ``{"grad": array}``, its default path
  (cross-memory from ``mpisync.transports.policy.CROSS_REDUCE_MIN_BYTES`` on one node), and the
  same with it off (``MPISYNC_CROSS_MEMORY=0`` while it opens): through MPI;
- ``torch all_reduce``: the backend's ``all_reduce`` of a tensor, default, and with cross-memory
  off (a second group that opened it with it off);
- ``MPI_Allreduce, torch``: of the tensor;
- ``limit``: the all-reduce's least work as local adds and copies on every rank at once
  (``mpisync.tools.bench.limits``).

numpy arrays of this size are on transparent huge pages (numpy advises them); torch's allocator
leaves 4 KiB pages, which cross-memory pins one by one.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpisync
import mpisync.torch
from mpisync.tools.bench.limits import limit_run
from mpisync.tools.bench.timing import measure_interleaved

_SWITCHES = ("MPISYNC_CROSS_MEMORY",)


def _off(make):
    """``make()`` with cross-memory off while it opens (at its first large call)."""
    os.environ.update(dict.fromkeys(_SWITCHES, "0"))
    try:
        return make()
    finally:
        for name in _SWITCHES:
            del os.environ[name]


def _rows(comm, mib: float, rounds: int, off_group) -> list:
    n = int(mib * (1 << 20)) // 4
    array = np.empty(n, np.float32)
    tensor, kept = torch.empty(n), torch.empty(n)  # kept: the paths-off group's
    base = np.random.default_rng(comm.rank).standard_normal(n).astype(np.float32)
    on, off = mpisync.GradSync(comm), mpisync.GradSync(comm)
    grads = {"grad": array}
    for _ in range(3):  # every path opened
        on.allreduce(grads)
        _off(lambda: off.allreduce(grads))
        dist.all_reduce(tensor)
        _off(lambda: dist.all_reduce(kept, group=off_group))
    limit = limit_run(comm, "all-reduce", n * 4, 0)
    targets = {
        "MPI_Allreduce, numpy": array,
        "GradSync, numpy": array,
        "GradSync, node paths off, numpy": array,
        "MPI_Allreduce, torch": kept.numpy(),
        "torch all_reduce": tensor.numpy(),
        "torch all_reduce, node paths off": kept.numpy(),
    }
    runs = {
        "MPI_Allreduce, numpy": lambda: comm.Allreduce(MPI.IN_PLACE, array),
        "GradSync, numpy": lambda: on.allreduce(grads),
        "GradSync, node paths off, numpy": lambda: off.allreduce(grads),
        "MPI_Allreduce, torch": lambda: comm.Allreduce(MPI.IN_PLACE, kept),
        "torch all_reduce": lambda: dist.all_reduce(tensor),
        "torch all_reduce, node paths off": lambda: dist.all_reduce(kept, group=off_group),
        "limit": limit,
    }

    def rewrite(name: str) -> None:
        if name in targets:
            targets[name][...] = base

    # Shuffled each round, the same on every rank: a row is not always the one after the same
    # other row (at 1 MiB the row after MPI_Allreduce's ran 5-29% slower).
    timings = measure_interleaved(comm, runs, iterations=rounds, warmup=0, before=rewrite)
    on.close()
    off.close()
    medians = {name: t.median * 1e3 for name, t in timings.items()}
    return [(mib, name, ms, medians["limit"] / ms) for name, ms in medians.items()]


def main() -> None:
    """Print the rows (rank 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", type=float, nargs="+", default=[8, 25, 64])
    args = parser.parse_args()
    mpisync.torch.init_process_group()
    comm = MPI.COMM_WORLD
    off_group = dist.new_group(backend="mpisync")
    if comm.rank == 0:
        print(f"{comm.size} ranks, {MPI.Get_library_version().splitlines()[0]}")
        print(f"{'MiB':>5}  {'row':<36} {'ms':>8}  {'of limit':>8}  {'x MPI':>6}")
    for mib in args.sizes:
        rows = _rows(comm, mib, args.rounds, off_group)
        mpi = {
            kind: ms
            for _, name, ms, _ in rows
            for kind in ("numpy", "torch")
            if name == f"MPI_Allreduce, {kind}"  # the 4 KiB-page tensor's, for torch
        }
        for _, name, ms, of_limit in rows:
            kind = "torch" if "torch" in name else "numpy"
            if comm.rank == 0:
                ratio = mpi[kind] / ms if name != "limit" else float("nan")
                print(f"{mib:>5g}  {name:<36} {ms:8.3f}  {of_limit:8.2f}  {ratio:6.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
