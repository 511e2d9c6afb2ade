"""One rank fails outside mpisync's calls while the others wait in a collective (run by
tests/launch/test_failfast.py).

``python failfast.py KIND``; the last rank is the one that fails:

- ``raise``: it raises ``ValueError`` before its sync; the others wait in ``sync_params``.
- ``ddp-shape``: torch DDP on the mpisync backend, its model shaped differently: torch's own
  check raises on it, the others wait in DDP's start-up broadcast.
- ``exit``: its script ends normally before its sync; the others wait in ``sync_params``.
- ``exit-torch``: its script ends normally; the others wait in ``dist.all_reduce``.
- ``exit-gradsync``: its script ends normally; the others wait in ``GradSync.allreduce``.
- ``exit-unrelated``: its script ends normally while the others sync on a communicator without
  it, then end too: no error.
- ``mismatch``: every rank calls ``sync_params``, the last with a parameter of another shape:
  the same ``ManifestMismatchError`` on every rank, uncaught (``mismatch-torch``: the same with
  torch's own uncaught-exception hook, after ``import mpisync.torch``).

Every rank that gets past its collective prints ``rank R finished``; a rank whose collective
raises (``MPISYNC_TIMEOUT_ABORT=0``) prints ``rank R raised NAME after S s: message``. The
failing rank prints ``rank R fails at T`` (``time.time()``) just before it fails, so that the
test times the job's end from the failure, not from its start (imports, ``MPI_Init``).
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpisync

kind = sys.argv[1]
comm = MPI.COMM_WORLD
last = comm.size - 1
failing = comm.rank == last
start = time.monotonic()
params = {"w": np.full(1 << 16, float(comm.rank), dtype=np.float32)}


def _fails() -> None:
    print(f"rank {comm.rank} fails at {time.time():.3f}", flush=True)


def _collective(call) -> None:
    try:
        call()
    except mpisync.SyncError as exc:
        seconds = time.monotonic() - start
        print(f"rank {comm.rank} raised {type(exc).__name__} after {seconds:.1f} s: {exc}")
        sys.stdout.flush()
        time.sleep(0.5)  # the launcher forwards the line before this exit ends the job
        os._exit(3)  # the collective is still pending: MPI_Finalize could wait for it
    print(f"rank {comm.rank} finished", flush=True)


if kind == "raise":
    if failing:
        time.sleep(0.5)  # the others are in their sync by now
        _fails()
        raise ValueError(f"a bug on rank {comm.rank} only")
    _collective(lambda: mpisync.sync_params(params, comm))
elif kind == "ddp-shape":
    import torch
    import torch.distributed as dist

    import mpisync.torch

    mpisync.torch.init_process_group()
    model = torch.nn.Linear(4, 3 if failing else 2)
    if failing:
        _fails()
    _collective(lambda: torch.nn.parallel.DistributedDataParallel(model))
elif kind in ("exit", "exit-torch", "exit-gradsync"):
    if kind == "exit-torch":
        import torch
        import torch.distributed as dist

        import mpisync.torch

        mpisync.torch.init_process_group()
    if failing:
        print(f"rank {comm.rank} leaves early", flush=True)
        _fails()
        sys.exit(0)
    if kind == "exit":
        _collective(lambda: mpisync.sync_params(params, comm))
    elif kind == "exit-gradsync":
        _collective(lambda: mpisync.GradSync(comm).allreduce(params))
    else:
        _collective(lambda: dist.all_reduce(torch.ones(4)))
elif kind == "exit-unrelated":
    others = comm.Split(0 if not failing else MPI.UNDEFINED, comm.rank)
    if failing:
        print(f"rank {comm.rank} leaves early", flush=True)
        _fails()
        sys.exit(0)
    time.sleep(1.0)  # the last rank's note has arrived
    _collective(lambda: mpisync.sync_params(params, others))
elif kind in ("mismatch", "mismatch-torch"):
    if kind == "mismatch-torch":
        import mpisync.torch  # noqa: F401
    if failing:
        params["w"] = params["w"][:-1].copy()
    mpisync.sync_params(params, comm)
else:
    raise SystemExit(f"unknown kind {kind!r}")
