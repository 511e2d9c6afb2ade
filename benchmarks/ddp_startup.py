"""DDP's start-up sync of a ResNet-50's parameters and buffers, by DDP and by ``sync_params``.

    mpiexec -n 2 python benchmarks/ddp_startup.py [--rounds 7]

A new model each round (torch's allocator, every rank its own values: a job's first sync of a
model it has just built), rows interleaved in an order shuffled each round, the same on every
rank; medians of the slowest rank's time (rank 0 prints):

- ``DDP(model)``: ``DistributedDataParallel`` on gloo and on mpisync's backend, whose start-up
  sync checks the shapes and syncs the parameters and buffers: on mpisync by ``sync_params``
  (:mod:`mpisync.torch.module_states`), and on a second mpisync group made with
  ``MPISYNC_TORCH_SYNC_PARAMS=0`` the way torch does it for any backend (the tensors joined into
  buckets of 250 MiB, each broadcast, the result copied back);
- ``DDP(model, init_sync=False) + sync_params``: DDP without its start-up sync, then
  ``mpisync.sync_params(model.state_dict())``;
- ``DDP(model, init_sync=False)``: DDP's construction alone (nothing synced);
- ``limit``: the broadcast's limit row of the same bytes (``mpisync.tools.bench.limits``).

Every synced row is checked: each rank's state then holds rank 0's bytes. The first round is not
timed: the first ``DistributedDataParallel`` of a process costs
about a second whatever the backend (torch's own set-up).
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel

import mpisync
import mpisync.torch
from mpisync.tools.bench.limits import limit_run
from mpisync.tools.bench.timing import measure_interleaved
from mpisync.tools.workloads import make_params, workload

_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")


def _model(shapes: dict, seed: int) -> torch.nn.Module:
    """A module holding a new tensor of each of ``shapes`` (buffers for BatchNorm's statistics,
    parameters otherwise), its values ``seed``'s."""
    module = torch.nn.Module()
    for name, tensor in make_params(shapes, seed, library="torch").items():
        key = name.replace(".", "_")
        if name.endswith(_BUFFERS):
            module.register_buffer(key, tensor)
        else:
            module.register_parameter(key, torch.nn.Parameter(tensor))
    return module


def _digest(module: torch.nn.Module) -> str:
    h = hashlib.blake2b(digest_size=8)
    for _, tensor in sorted(module.state_dict().items()):
        h.update(tensor.numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    """Print the rows (rank 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    mpisync.torch.init_process_group(backend="cpu:mpisync")
    gloo = dist.new_group(backend="gloo")
    os.environ["MPISYNC_TORCH_SYNC_PARAMS"] = "0"
    torchs = dist.new_group(backend="mpisync")
    del os.environ["MPISYNC_TORCH_SYNC_PARAMS"]
    shapes = workload("resnet50")
    nbytes = sum(t.numel() * t.element_size() for t in make_params(shapes, 0, "torch").values())
    limit = limit_run(comm, "broadcast", nbytes)
    runs = {
        "DDP(model), gloo": lambda m: DistributedDataParallel(m, process_group=gloo),
        "DDP(model), mpisync": lambda m: DistributedDataParallel(m),
        "DDP(model), mpisync, torch's sync": lambda m: DistributedDataParallel(
            m, process_group=torchs
        ),
        "DDP(model, init_sync=False) + sync_params": lambda m: (
            DistributedDataParallel(m, init_sync=False),
            mpisync.sync_params(m.state_dict()),
        ),
        "DDP(model, init_sync=False)": lambda m: DistributedDataParallel(m, init_sync=False),
    }
    built: dict = {}
    checked = []

    def before(name: str) -> None:
        if name in built and name in runs:  # the previous round's model: synced as it claims?
            digests = comm.allgather(_digest(built[name]))
            if "+" in name or name.startswith("DDP(model),"):
                checked.append(len(set(digests)) == 1)
        if name in runs:
            built[name] = _model(shapes, 1000 * comm.rank + len(checked))

    timed = {name: (lambda n=name: runs[n](built[n])) for name in runs}
    timed["limit"] = limit
    timings = measure_interleaved(comm, timed, iterations=args.rounds, warmup=1, before=before)
    for name in runs:
        before(name)  # checks the last round's models
    limit_ms = timings["limit"].median * 1e3
    if comm.rank == 0:
        print(f"{comm.size} ranks, ResNet-50 parameters and buffers, {nbytes / 1e6:.1f} MB")
        print(f"  {'row':48} {'ms':>9} {'of limit':>9}")
        for name, timing in timings.items():
            ms = timing.median * 1e3
            print(f"  {name:48} {ms:9.2f} {limit_ms / ms:9.2f}")
        print(f"  every synced row held rank 0's bytes on every rank: {all(checked)}")
    assert all(checked) and checked
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
