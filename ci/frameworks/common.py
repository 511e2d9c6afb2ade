"""What every frameworks script shares: the default group on either backend, the model and data,
and the result line the runner compares between the two backends (run.py).

Each script runs under ``mpiexec -n N`` as ``python SCRIPT.py BACKEND [VARIANT]``, BACKEND
``gloo`` or ``mpisync``, and prints one ``RESULT`` line per rank (also written to
``$FRAMEWORKS_TMP/result-RANK.txt``): a digest of the final parameters' bytes and every loss as
``float.hex`` (bit for bit, not rounded).
"""

import datetime
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from mpi4py import MPI

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
TIMEOUT = datetime.timedelta(seconds=120)


def backend() -> str:
    """The backend the runner asked for (``gloo`` or ``mpisync``)."""
    return sys.argv[1]


def variant(default: str = "") -> str:
    """The script's variant argument (``powersgd``, ``async-fsdp2``, ...)."""
    return sys.argv[2] if len(sys.argv) > 2 else default


def rendezvous_env() -> None:
    """torch's env:// variables, for frameworks that initialise the group themselves."""
    os.environ.update(
        RANK=str(RANK),
        WORLD_SIZE=str(SIZE),
        LOCAL_RANK=str(RANK),
        LOCAL_WORLD_SIZE=str(SIZE),
        MASTER_ADDR="127.0.0.1",
    )
    os.environ.setdefault("MASTER_PORT", os.environ.get("FRAMEWORKS_PORT", "29400"))


def init() -> None:
    """The default group: mpisync over MPI.COMM_WORLD, or gloo through the runner's file
    store."""
    if backend() == "mpisync":
        import mpisync.torch

        mpisync.torch.init_process_group(timeout=TIMEOUT)
    else:
        store = "file://" + os.environ["FRAMEWORKS_STORE"]
        dist.init_process_group(
            "gloo", init_method=store, rank=RANK, world_size=SIZE, timeout=TIMEOUT
        )


def model(width: int = 64) -> torch.nn.Sequential:
    """The same small model on every rank (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, 8)
    )


def batches(steps: int = 4, rows: int = 16, same: bool = False) -> list:
    """``steps`` (input, target) pairs: each rank's own, or the same on every rank (``same``)."""
    generator = torch.Generator().manual_seed(1 if same else 1 + RANK)
    return [
        (torch.randn(rows, 32, generator=generator), torch.randn(rows, 8, generator=generator))
        for _ in range(steps)
    ]


def train(module, optimizer, steps: int = 4) -> list:
    """``steps`` steps of MSE on each rank's own batches; the losses."""
    losses = []
    for x, y in batches(steps):
        loss = torch.nn.functional.mse_loss(module(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def report(name: str, tensors, losses) -> None:
    """The result line: the parameters' bytes digested, the losses exactly."""
    values = [tensor.detach().to("cpu").contiguous().float().reshape(-1) for tensor in tensors]
    flat = torch.cat(values) if values else torch.zeros(0)
    digest = hashlib.sha256(flat.numpy().tobytes())
    shown = " ".join(float(loss).hex() for loss in losses)
    line = f"RESULT {name} rank {RANK}: params {digest.hexdigest()[:24]} losses {shown}"
    print(line, flush=True)
    # a file per rank too: the launcher may glue the ranks' stdout lines together
    folder = os.environ.get("FRAMEWORKS_TMP")
    if folder:
        with open(os.path.join(folder, f"result-{RANK}.txt"), "w") as out:
            out.write(line + "\n")
        torch.save(
            {"params": flat, "losses": torch.tensor(losses, dtype=torch.float64)},
            os.path.join(folder, f"result-{RANK}.pt"),
        )


def finish() -> None:
    """Destroy the default group, if there is one."""
    if dist.is_initialized():
        dist.destroy_process_group()
