"""The torch backend's in-place and aliased forms beside their plain forms, in one run.

    mpiexec -n 2 python benchmarks/torch_aliased.py [--rounds 30] [--sizes 1048576 26214400]

Rows (each the median of ``--rounds`` calls, a barrier before each, the tensors rewritten
before each call as a training step does; rank 0 prints):

- ``all_reduce`` and ``reduce`` of the same tensor;
- ``all_gather_into_tensor`` from a separate input, and in place (the input this rank's block
  of the output: FSDP2's form);
- ``reduce_scatter_tensor`` into a separate output, and in place (the output a block of the
  input);
- ``all_to_all_single`` with separate tensors, and with one tensor in and out;
- ``MPI_Ireduce_scatter_block`` and ``MPI_Reduce_scatter_block`` of the same bytes through
  mpi4py alone (no mpisync code): what the library's nonblocking and blocking forms cost.

Sizes are bytes of float32 per rank's full tensor.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpisync.torch


def _median(call, refill, rounds: int) -> float:
    times = []
    for i in range(rounds):
        refill(i)
        dist.barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def _rows(nbytes: int, rounds: int) -> list:
    rank, size = dist.get_rank(), dist.get_world_size()
    n = nbytes // 4 // size * size
    full, other = torch.ones(n), torch.ones(n)
    block = torch.ones(n // size)

    def refill(i):
        full.fill_(1.0 + i)
        other.fill_(2.0 + i)
        block.fill_(3.0 + i)

    mine = full.chunk(size)[rank]
    # torch 2.13 renames them (the old names warn on every call)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    pairs = [
        ("all_reduce", lambda: dist.all_reduce(full)),
        ("reduce", lambda: dist.reduce(full, dst=0)),
        ("all_gather_into_tensor", lambda: gather(full, block)),
        ("all_gather_into_tensor, in place", lambda: gather(full, mine)),
        ("reduce_scatter_tensor", lambda: scatter(block, full)),
        ("reduce_scatter_tensor, in place", lambda: scatter(mine, full)),
        ("all_to_all_single", lambda: dist.all_to_all_single(other, full)),
        ("all_to_all_single, one tensor", lambda: dist.all_to_all_single(full, full)),
    ]
    comm, half = MPI.COMM_WORLD, np.full(n // size, 0.0, np.float32)  # written: no zero page
    raw = full.numpy()
    pairs += [
        ("MPI_Ireduce_scatter_block", lambda: comm.Ireduce_scatter_block(raw, half).Wait()),
        ("MPI_Reduce_scatter_block", lambda: comm.Reduce_scatter_block(raw, half)),
    ]
    # alternate the forms round by round so that both see the same machine
    results: dict = {name: [] for name, _ in pairs}
    for _ in range(3):
        for name, call in pairs:
            results[name].append(_median(call, refill, rounds))
    return [(name, min(values)) for name, values in results.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1 << 20, 25 << 20])
    args = parser.parse_args()
    mpisync.torch.init_process_group(timeout=120)
    for nbytes in args.sizes:
        rows = _rows(nbytes, args.rounds)
        if dist.get_rank() == 0:
            plain = dict(rows)
            print(f"{nbytes / 2**20:g} MiB per rank, {dist.get_world_size()} ranks, ms (median):")
            for name, ms in rows:
                base = name.split(",")[0]
                ratio = "" if base == name else f"  ({ms / plain[base]:.2f}x {base})"
                if name == "reduce":
                    ratio = f"  ({ms / plain['all_reduce']:.2f}x all_reduce)"
                print(f"  {name:36s} {ms:8.3f}{ratio}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
