"""The torch backend's list forms of all_gather and reduce_scatter, by cross-memory and through
MPI, in one run.

    mpiexec -n 2 python benchmarks/torch_lists.py [--rounds 20] [--sizes 25]

Rows per size (MiB of float32 in each rank's input of ``all_gather``, and in each piece of
``reduce_scatter``; each the median of ``--rounds`` calls of the slowest rank, a barrier before
each, the inputs rewritten before each call; the rows interleaved round by round in an order
shuffled each round, the same on every rank; rank 0 prints):

- ``all_gather`` into separate output tensors, on the default group (cross-memory from
  ``mpisync.transports.crossreduce.MIN_BYTES`` of outputs on one node) and on a group probed with
  cross-memory off (``MPI_Iallgather`` into one buffer, then copied out);
- ``reduce_scatter`` of separate pieces into a separate output, the same two groups (off: the
  pieces joined into one buffer, then ``MPI_Ireduce_scatter_block``);
- ``limit``: each operation's least work as local copies and adds on every rank at once
  (``mpisync.tools.bench.limits``: the out-of-place all-gather, the reduce-scatter).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpisync.torch
from mpisync.tools.bench.limits import limit_run
from mpisync.tools.bench.timing import measure_interleaved


def _off_group():
    """A group of every rank whose probe ran with cross-memory off."""
    os.environ["MPISYNC_CROSS_MEMORY"] = "0"
    try:
        group = dist.new_group(backend="mpisync")
        probe = [torch.empty(1 << 22) for _ in range(dist.get_world_size())]
        dist.all_gather(probe, torch.empty(1 << 22), group=group)  # its first large call probes
        return group
    finally:
        del os.environ["MPISYNC_CROSS_MEMORY"]


def _rows(comm, mib: float, rounds: int, off) -> dict:
    size = comm.size
    n = int(mib * (1 << 20)) // 4
    data = torch.empty(n)
    outputs = [torch.empty(n) for _ in range(size)]
    pieces = [torch.empty(n) for _ in range(size)]
    out = torch.empty(n)

    def refill(name: str) -> None:
        data.fill_(1.0)
        for p in pieces:
            p.fill_(2.0)

    runs = {
        "all_gather": lambda: dist.all_gather(outputs, data),
        "all_gather, cross-memory off": lambda: dist.all_gather(outputs, data, group=off),
        "limit, all-gather out of place": limit_run(comm, "all-gather out of place", n * 4 * size),
        "reduce_scatter": lambda: dist.reduce_scatter(out, pieces),
        "reduce_scatter, cross-memory off": lambda: dist.reduce_scatter(out, pieces, group=off),
        "limit, reduce-scatter": limit_run(comm, "reduce-scatter", n * 4 * size),
    }
    timings = measure_interleaved(comm, runs, iterations=rounds, warmup=1, before=refill)
    return {name: t.median * 1e3 for name, t in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sizes", type=float, nargs="*", default=[25])
    args = parser.parse_args()
    mpisync.torch.init_process_group(timeout=120)
    comm = MPI.COMM_WORLD
    off = _off_group()
    if comm.rank == 0:
        print(f"{comm.size} ranks; ms: median of {args.rounds} calls of the slowest rank")
        print(f"  {'MiB':>5}  {'row':34s} {'ms':>8} {'of limit':>9} {'x off':>6}")
    for mib in args.sizes:
        rows = _rows(comm, mib, args.rounds, off)
        for name, ms in rows.items() if comm.rank == 0 else ():
            base = name.split(",")[0]
            if base == "limit":
                print(f"  {mib:5g}  {name:34s} {ms:8.3f}")
                continue
            kind = "all-gather out of place" if base == "all_gather" else "reduce-scatter"
            ratios = rows[f"limit, {kind}"] / ms, rows[f"{base}, cross-memory off"] / ms
            print(f"  {mib:5g}  {name:34s} {ms:8.3f} {ratios[0]:9.2f} {ratios[1]:6.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
