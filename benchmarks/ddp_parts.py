"""Where a DDP step of the bench's MLP goes: its parts timed side by side, on the same model shape.

    mpiexec -n 2 python benchmarks/ddp_parts.py [--iterations 21] [--threads 1]

Rows (medians of the slowest rank, interleaved in a shuffled order per iteration):

- no communication: forward, backward and SGD of the plain model;
- DDP, no-op hook: the same through ``DistributedDataParallel`` with a communication hook
  that returns each bucket untouched: DDP's own cost (bucket copies, autograd hooks), no bytes
  moved;
- step, then the all_reduces: the plain step, then blocking ``all_reduce`` calls on the mpisync
  group of every gradient's bytes, in pieces of DDP's default bucket size (25 MiB): the
  communication without any overlap;
- the all_reduces alone;
- mpisync and gloo: DDP on each backend.

The model steps are the bench's DDP row (``mpisync.tools.bench.allreduce.ddp_runs``).

The ratios that bound the bench's targets follow: what compute/step could be with free
communication (DDP's own cost only) and with communication after the backward pass instead
of overlapped with it.
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    """Time the parts; rank 0 prints them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    from mpisync.tools.bench.allreduce import _groups, _mlp, ddp_runs
    from mpisync.tools.bench.timing import measure_interleaved

    torch.set_num_threads(args.threads)
    comm = MPI.COMM_WORLD
    mpisync_group, gloo_group, created = _groups(comm)
    runs = ddp_runs(comm, {"mpisync": mpisync_group, "gloo": gloo_group})
    gradients = torch.zeros(sum(p.numel() for p in _mlp(0).parameters()))
    buckets = gradients.split(25 << 18)  # 25 MiB of float32, DDP's bucket_cap_mb

    def all_reduces():
        for bucket in buckets:
            dist.all_reduce(bucket, group=mpisync_group)

    plain_step = runs["no communication"]
    runs["step, then the all_reduces"] = lambda: (plain_step(), all_reduces())
    runs["the all_reduces alone"] = all_reduces
    timings = measure_interleaved(comm, runs, iterations=args.iterations, warmup=3)
    ms = {name: t.median * 1e3 for name, t in timings.items()}
    if comm.rank == 0:
        print(
            f"DDP parts, {comm.size} ranks, {gradients.numel() * 4 / 1e6:.1f} MB of gradients in "
            f"{len(buckets)} "
            f"all_reduces, "
            f"{args.threads} torch thread(s) per rank, medians of {args.iterations} (slowest rank)"
        )
        for name, value in ms.items():
            print(f"  {name:28} {value:8.2f} ms")
        plain = ms["no communication"]
        print(
            "  compute/step with free communication (DDP, no-op hook): "
            f"{plain / ms['DDP, no-op hook']:.2f}"
        )
        serial = ms["DDP, no-op hook"] + ms["the all_reduces alone"]
        print(
            f"  compute/step with the all_reduces after the backward pass: {plain / serial:.2f}"
            f" (gloo / that step: {ms['gloo'] / serial:.2f}x)"
        )
        print(
            f"  DDP on mpisync: compute/step {plain / ms['mpisync']:.2f}, "
            f"x{ms['gloo'] / ms['mpisync']:.2f} vs gloo"
        )
    if created:
        dist.destroy_process_group()
    else:
        mpisync_group.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
