"""The torch backend when a rank is late, and torch's own rendezvous under mpiexec (run by
tests/launch/test_torch_faults.py).

``python torch_faults.py KIND``: KIND is ``late-init`` (the last rank calls
``mpisync.torch.init_process_group(timeout=3)`` 8 s after the others), ``late-group`` (the last
rank calls ``new_group([0, last], timeout=3 s)`` 8 s after the others), or ``env`` (no fault:
``torch.distributed.init_process_group("mpisync")`` with none of torch's variables set).
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpisync.torch

kind = sys.argv[1]
comm = MPI.COMM_WORLD
late = comm.rank == comm.size - 1
start = time.monotonic()


def _raised(exc: BaseException) -> None:
    seconds = time.monotonic() - start
    print(f"rank {comm.rank} raised {type(exc).__name__} after {seconds:.1f} s: {exc}", flush=True)
    os._exit(3)  # a collective may still be pending: MPI_Finalize could wait for it


if kind == "env":
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    dist.init_process_group("mpisync")
    tensor = torch.full((3,), float(comm.rank + 1))
    dist.all_reduce(tensor)
    print(
        f"rank {dist.get_rank()} of {dist.get_world_size()}: backend {dist.get_backend()}, "
        f"sum {tensor.tolist()}",
        flush=True,
    )
    dist.destroy_process_group()
    sys.exit(0)
if kind == "late-init":
    if late:
        time.sleep(8)
    try:
        mpisync.torch.init_process_group(timeout=3)
    except Exception as exc:  # MPISYNC_TIMEOUT_ABORT=0 only
        _raised(exc)
elif kind == "late-group":
    mpisync.torch.init_process_group(timeout=30)
    if late:
        time.sleep(8)
    try:
        group = dist.new_group([0, comm.size - 1], timeout=datetime.timedelta(seconds=3))
    except Exception as exc:
        _raised(exc)
print(f"rank {comm.rank} finished", flush=True)
