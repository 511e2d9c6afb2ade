"""Data-parallel training with torch DistributedDataParallel on mpisync's "mpisync" backend.

    mpiexec -n 4 python examples/ddp_train.py --steps 20

No MASTER_ADDR, RANK or WORLD_SIZE: rank and size come from MPI. Every rank
starts from different random weights; DDP's start-up sync (on the mpisync
backend, mpisync.sync_params) gives every rank rank 0's, and the gradient all-reduce
keeps them equal. At the end every rank checks, with mpisync.allreduce, that
all ranks hold the same weights, and prints a digest of its own.
"""

import argparse
import hashlib

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

import mpisync
import mpisync.torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()

    mpisync.torch.init_process_group()
    rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    # different weights everywhere: DDP's start-up sync makes them rank 0's
    torch.manual_seed(rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width),
        torch.nn.ReLU(),
        torch.nn.Linear(args.width, 1),
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    # the same task on every rank
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(0))
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of samples
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 16, generator=data)
        loss = torch.nn.functional.mse_loss(ddp(x), x @ target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 5 == 0 or step == args.steps:
            mean_loss = loss.detach().clone()
            torch.distributed.all_reduce(mean_loss, op=torch.distributed.ReduceOp.AVG)
            if rank == 0:
                print(
                    f"step {step}: loss {mean_loss.item():.4f} (mean over {size} ranks)", flush=True
                )

    weights = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    spread = {name: w.copy() for name, w in weights.items()}
    mpisync.allreduce(weights, op="max")
    mpisync.allreduce(spread, op="min")
    same = all(np.array_equal(weights[n], spread[n]) for n in weights)
    digest = hashlib.blake2b(b"".join(weights[n].tobytes() for n in sorted(weights)), digest_size=8)
    print(
        f"rank {rank}/{size}: {sum(w.size for w in weights.values())} weights identical on every "
        f"rank: {same}; digest {digest.hexdigest()}",
        flush=True,
    )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
