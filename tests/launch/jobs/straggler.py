"""A job where the last rank never calls sync_params: the others must time out, report, and
abort."""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpisync

comm = MPI.COMM_WORLD
params = {"encoder.weight": np.zeros(1000, np.float32), "decoder.bias": np.zeros(10, np.float32)}
if comm.rank == comm.size - 1:
    time.sleep(float(os.environ.get("STRAGGLER_SLEEP", "60")))
    # The others left without MPI_Finalize (below), so finalizing here could wait for them forever
    # when the launcher has not ended this process by then.
    os._exit(0)
try:
    mpisync.sync_params(params, comm, root=0, timeout=float(sys.argv[1]))
except mpisync.SyncTimeoutError as exc:
    print(f"rank {comm.rank} raised SyncTimeoutError: {exc}", flush=True)
    os._exit(3)  # the straggler's collective is still pending: leave without MPI_Finalize
print(f"rank {comm.rank} finished without error", flush=True)
