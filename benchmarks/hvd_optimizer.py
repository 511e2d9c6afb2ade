"""``hvd.DistributedOptimizer``'s gradient all-reduce against ``mpisync.GradSync`` of the same
gradients, side by side.

    mpiexec -n 2 python benchmarks/hvd_optimizer.py [--iterations 15] [--warmup 3]

The gradients have the shapes of ResNet-18's parameters (listed below, no torchvision needed:
62 tensors, 11.7 M float32 values). Each iteration times ``optimizer.synchronize()`` (the
all-reduce part of a step: one named operation of mpisync.horovod's engine around one
``GradSync`` call) and ``GradSync.allreduce`` of the same gradient tensors, in a shuffled order
(medians of the slowest rank). Rank 0 prints both, their ratio, and the load average, since
timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import sys


def resnet18_shapes() -> list:
    """``(name, shape)`` of every parameter of ResNet-18 (ImageNet head)."""
    shapes = [("conv1.weight", (64, 3, 7, 7)), ("bn1.weight", (64,)), ("bn1.bias", (64,))]
    channels = 64
    for layer, width in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            prefix = f"layer{layer}.{block}"
            first = channels if block == 0 else width
            shapes += [
                (f"{prefix}.conv1.weight", (width, first, 3, 3)),
                (f"{prefix}.bn1.weight", (width,)),
                (f"{prefix}.bn1.bias", (width,)),
                (f"{prefix}.conv2.weight", (width, width, 3, 3)),
                (f"{prefix}.bn2.weight", (width,)),
                (f"{prefix}.bn2.bias", (width,)),
            ]
            if block == 0 and first != width:
                shapes += [
                    (f"{prefix}.downsample.0.weight", (width, first, 1, 1)),
                    (f"{prefix}.downsample.1.weight", (width,)),
                    (f"{prefix}.downsample.1.bias", (width,)),
                ]
        channels = width
    return shapes + [("fc.weight", (1000, 512)), ("fc.bias", (1000,))]


def print_rows(what: str, ranks: int, iterations: int, timings: dict) -> None:
    """The title line (``what``, the medians' count, the load average) and one line per row."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{what}, {ranks} ranks, medians of {iterations} (slowest rank), load average {load}")
    for name, timing in timings.items():
        print(f"  {name:36s} {timing.median * 1e3:8.2f} ms")


def main(argv=None) -> int:
    """Time both ways; rank 0 prints them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)

    import torch
    from mpi4py import MPI

    import mpisync
    import mpisync.horovod as hvd
    from mpisync.tools.bench.timing import measure_interleaved

    comm = MPI.COMM_WORLD
    hvd.init(comm)
    shapes = resnet18_shapes()
    params = [torch.nn.Parameter(torch.zeros(shape)) for _, shape in shapes]
    for p in params:
        p.grad = torch.full_like(p, float(comm.rank))
    named = [(name, p) for (name, _), p in zip(shapes, params)]
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=named)
    # the same tensors (a separately allocated set lies elsewhere in memory: another speed)
    grads = {name: p.grad for name, p in named}
    sync = mpisync.GradSync(comm, op="avg")
    runs = {
        "DistributedOptimizer": optimizer.synchronize,
        "GradSync": lambda: sync.allreduce(grads),
    }
    timings = measure_interleaved(comm, runs, iterations=args.iterations, warmup=args.warmup)
    expected = float(sum(range(comm.size))) / comm.size
    assert all(torch.all(p.grad == expected) for p in params)  # the average, reduced again
    assert all(torch.all(g == expected) for g in grads.values())
    if comm.rank == 0:
        values = sum(p.numel() for p in params)
        what = f"{len(params)} gradients, {values / 1e6:.1f} M float32"
        print_rows(what, comm.size, args.iterations, timings)
        ratio = timings["DistributedOptimizer"].median / timings["GradSync"].median
        print(f"  DistributedOptimizer / GradSync: {ratio:.3f}x")
    sync.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
