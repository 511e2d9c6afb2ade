"""Three syncs of 8 MiB with the shared segment asked for; prints the channel of each and checks
bytes.

Run under a /dev/shm too small for the segment (test_launch.py does), every rank must keep MPI.
"""

import numpy as np
from mpi4py import MPI

import mpisync

comm = MPI.COMM_WORLD
params = {"w": np.full(2 << 20, comm.rank + 1, np.float32)}
channels = []
with mpisync.ParamSync(comm) as syncer:
    for _ in range(3):
        params["w"][:] = comm.rank + 1
        channels.append(syncer.sync(params).channel)
        assert bool((params["w"] == 1).all()), "bytes differ from root's"
print(f"rank {comm.rank}: channels {channels}", flush=True)
