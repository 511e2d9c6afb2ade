"""A training step of ResNet-18 (synthetic images) with each way mpisync reduces gradients, and
the step without any communication beside them.

    mpiexec -n 2 python benchmarks/training_step.py [--batch 8] [--steps 10] [--rounds 5]
    MPISYNC_LINK_RATE=1gbit bash ci/multihost.sh 2 1 --run python benchmarks/training_step.py

Rows, run in turn within each round (the order rotates from round to round, so that no row
always runs first): ``compute only`` (forward, backward and the optimizer's step, no
communication: the floor), ``horovod overlap`` (``mpisync.horovod.DistributedOptimizer``, each
bucket's all-reduce started during backward), ``horovod at step`` (the same, every gradient
reduced at ``step()``), ``ddp`` (``DistributedDataParallel`` on the ``mpisync`` backend). Each
row's figure is images per second over the ranks (batch x ranks / the slowest rank's median
step). ``--rows "real horovod"`` runs Horovod's own ``DistributedOptimizer`` instead (Horovod's
defaults), alone, where Horovod is installed: launch it alternately with the others to compare.
Rank 0 prints min / median / max over the rounds, and how much of the communication each
row hides: ``1 - (row - compute) / (at step - compute)``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

ROWS = ("compute only", "horovod overlap", "horovod at step", "ddp")
#: Run alone (``--rows "real horovod"``) in an environment where Horovod itself is installed.
REAL = "real horovod"


def resnet18(num_classes: int = 1000):
    """ResNet-18 (basic blocks, ImageNet head) in plain torch, as torchvision builds it."""
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True)]
    layers.append(nn.MaxPool2d(3, 2, 1))
    cin = 64
    for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, width, stride), Block(width, width, 1)]
        cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def _trainer(row: str, hvd):
    """``(model, step)`` for ``row``: ``step(images, labels)`` runs one training step."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = resnet18()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if row == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif row == REAL:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    elif row.startswith("horovod"):
        optimizer = hvd.DistributedOptimizer(
            optimizer,
            named_parameters=model.named_parameters(),
            overlap=(row == "horovod overlap"),
        )

    def step(images, labels) -> None:
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()

    return step


def _median_step(comm, step, images, labels, steps: int) -> float:
    """The slowest rank's median step time, seconds, after one warm-up step."""
    step(images, labels)
    times = []
    for _ in range(steps):
        comm.Barrier()
        start = time.perf_counter()
        step(images, labels)
        times.append(comm.allreduce(time.perf_counter() - start, op=_max()))
    return statistics.median(times)


def _max():
    from mpi4py import MPI

    return MPI.MAX


def main(argv=None) -> int:
    """Run the rounds; rank 0 prints the table (and ``--json`` writes it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--rows",
        default=",".join(ROWS),
        help="comma-separated, of: " + ", ".join(ROWS) + f"; or {REAL!r} alone",
    )
    parser.add_argument("--json", help="write every round's figures here (rank 0)")
    args = parser.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",")]

    import torch
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if rows == [REAL]:
        import horovod.torch as hvd

        hvd.init()
    else:
        import mpisync.horovod as hvd
        import mpisync.torch

        hvd.init()
        mpisync.torch.init_process_group()
    torch.manual_seed(comm.rank)
    images = torch.randn(args.batch, 3, 224, 224)
    labels = torch.randint(0, 1000, (args.batch,))
    rates: dict[str, list] = {row: [] for row in rows}
    for round_ in range(args.rounds):
        for row in rows[round_ % len(rows) :] + rows[: round_ % len(rows)]:
            seconds = _median_step(comm, _trainer(row, hvd), images, labels, args.steps)
            rates[row].append(args.batch * comm.size / seconds)
    if comm.rank == 0:
        _print(rates, comm.size, args)
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"ranks": comm.size, "batch": args.batch, "img_per_s": rates}, out)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def _print(rates: dict, ranks: int, args) -> None:
    print(
        f"ResNet-18, batch {args.batch} per rank, {ranks} ranks, {args.rounds} rounds of "
        f"{args.steps} steps; img/s over the ranks, min / median / max"
    )
    # seconds per step, from the medians: what each row adds to compute is its communication
    seconds = {row: args.batch * ranks / statistics.median(r) for row, r in rates.items()}
    compute, serial = seconds.get("compute only"), seconds.get("horovod at step")
    for row, r in rates.items():
        line = f"  {row:16s} {min(r):8.1f} {statistics.median(r):8.1f} {max(r):8.1f}"
        if (
            compute is not None
            and serial is not None
            and serial > compute
            and row != "compute only"
        ):
            hidden = 1 - (seconds[row] - compute) / (serial - compute)
            line += f"   hides {100 * hidden:5.1f}% of the communication"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
