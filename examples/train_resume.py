"""Data-parallel training that syncs at start and after resuming from a checkpoint.

    mpiexec -n 2 python examples/train_resume.py --steps 20 --save ckpt.npz
    mpiexec -n 2 python examples/train_resume.py --steps 20 --resume ckpt.npz

Every rank initialises its model differently (as independent processes do);
``mpisync.broadcast_parameters`` makes the parameters root's and
``mpisync.broadcast_optimizer_state`` the Adam state (moment tensors, step
counters, learning rate): on resume only root has loaded that state, and the
other ranks get its structure from root first (as with Horovod). Gradients are
averaged with ``Allreduce``, so the replicas stay identical while training.
Checkpoints are ``.npz`` (no pickle), saved by root, read by root alone on
resume (after ``mpisync stage-checkpoint`` has put them on each node's disk).
"""

import argparse
import hashlib
import json
import os

import numpy as np
import torch
from mpi4py import MPI

import mpisync


def build(rank: int):
    torch.manual_seed(1000 + rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    return model, torch.optim.Adam(model.parameters(), lr=3e-3)


def digest(model, opt) -> str:
    h = hashlib.blake2b(digest_size=8)
    for t in model.state_dict().values():
        h.update(t.detach().numpy().tobytes())
    for state in opt.state_dict()["state"].values():
        for t in state.values():
            h.update(t.numpy().tobytes())
    return h.hexdigest()


def save(path, model, opt) -> None:
    arrays = {f"model/{k}": v.detach().numpy() for k, v in model.state_dict().items()}
    optim = opt.state_dict()
    for index, state in optim["state"].items():
        arrays.update({f"optim/{index}/{k}": v.numpy() for k, v in state.items()})
    arrays["optim_groups"] = np.array(json.dumps(optim["param_groups"]))  # a string, not a pickle
    tmp = f"{path}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)  # a crash mid-save never leaves a half-written checkpoint


def load(path, model, opt) -> None:
    with np.load(path, allow_pickle=False) as data:
        model.load_state_dict(
            {k[6:]: torch.from_numpy(data[k]) for k in data.files if k.startswith("model/")}
        )
        state = {}
        for key in data.files:
            if key.startswith("optim/"):
                _, index, name = key.split("/")
                state.setdefault(int(index), {})[name] = torch.from_numpy(data[key])
        groups = json.loads(str(data["optim_groups"]))
    for group in groups:
        group["betas"] = tuple(group["betas"])
    opt.load_state_dict({"state": state, "param_groups": groups})


def train(comm, model, opt, steps: int, seed: int) -> float:
    rng = np.random.default_rng(seed * 100 + comm.rank)  # each rank its own shard of data
    loss = float("nan")
    for _ in range(steps):
        x = torch.from_numpy(rng.standard_normal((32, 16), dtype=np.float32))
        y = x[:, :4].sum(dim=1, keepdim=True).repeat(1, 4)
        opt.zero_grad()
        out = torch.nn.functional.mse_loss(model(x), y)
        out.backward()
        for p in model.parameters():  # average gradients: the replicas stay identical
            grad = p.grad.numpy()
            comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
            grad /= comm.size
        opt.step()
        loss = float(out.detach())
    # BatchNorm running statistics saw each rank's own data: bring them back to root's.
    mpisync.sync_params(dict(model.named_buffers()), comm)
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--save", help="checkpoint to write (root) after training")
    parser.add_argument("--resume", help="checkpoint to resume from (read on root only)")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    model, opt = build(comm.rank)
    if args.resume and comm.rank == 0:  # root alone reads the checkpoint
        load(args.resume, model, opt)
    mpisync.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
    # the other ranks have no state yet: root's structure
    mpisync.broadcast_optimizer_state(opt, root_rank=0, comm=comm)
    start = digest(model, opt)
    loss = train(comm, model, opt, args.steps, seed=1 if not args.resume else 2)
    end = digest(model, opt)
    ends = np.empty((comm.size, 8), np.uint8)
    comm.Allgather(np.frombuffer(bytes.fromhex(end), np.uint8), ends)
    same = bool((ends == ends[0]).all())
    print(
        f"rank {comm.rank}/{comm.size}: "
        f"{'resumed from ' + args.resume if args.resume else 'fresh start'}; "
        f"synced state {start}; after {args.steps} steps loss {loss:.4f}, state {end}; "
        f"identical on every rank: {same}",
        flush=True,
    )
    if args.save and comm.rank == 0:
        save(args.save, model, opt)
        print(f"rank 0: saved {args.save}", flush=True)


if __name__ == "__main__":
    main()
