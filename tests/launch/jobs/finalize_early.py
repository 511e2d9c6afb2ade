"""A rank that calls ``MPI.Finalize()`` itself, then exits, while rank 0 waits for it in
``sync_params`` (run by tests/launch/test_failfast.py).

Rank 1 prints ``rank 1 fails at T`` (``time.time()``), finalizes MPI and ends its script. Inside
its ``MPI_Finalize``, after mpisync's own finalize callback (MPI deletes ``MPI.COMM_SELF``'s
attributes in the reverse order they were set: this job's is set before mpisync is imported),
it prints what mpisync's departure watch holds (``rank 1 at finalize: closed=... receive=...
kept=...``: whether the notes went out, the receive still posted, how many objects were
abandoned to MPI); MPICH's ``MPI_Finalize`` then waits for rank 0, which never comes. Rank 0
syncs and prints ``rank 0 raised NAME after S s: message`` (``MPISYNC_TIMEOUT_ABORT=0``) or
``rank 0 finished``.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI


def _report(comm, keyval, value) -> None:
    from mpisync._runtime import failfast, keepalive

    watch = failfast._watch
    print(
        f"rank 1 at finalize: closed={watch.closed} receive={watch.request} "
        f"kept={keepalive.kept()}",
        flush=True,
    )


if MPI.COMM_WORLD.rank == 1:
    MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=_report), None)

import mpisync  # noqa: E402 - after the attribute above

comm = MPI.COMM_WORLD
params = {"w": np.full(1 << 10, float(comm.rank), dtype=np.float32)}

if comm.rank == 1:
    time.sleep(0.5)  # rank 0 is in its sync by now
    print(f"rank 1 fails at {time.time():.3f}", flush=True)
    MPI.Finalize()
    sys.exit(0)

start = time.monotonic()
try:
    mpisync.sync_params(params, comm)
except mpisync.SyncError as exc:
    print(f"rank 0 raised {type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}")
    sys.stdout.flush()
    time.sleep(0.5)
    os._exit(3)  # the collective is still pending: MPI_Finalize could wait for it
print("rank 0 finished", flush=True)
