"""A plain mpi4py master/worker program whose only change is ``import mpisync`` and one sync
(run by tests/launch/test_user_traffic.py at 4 ranks).

Every rank syncs a parameter once (so mpisync is in use on every rank) and runs a nonblocking
all-reduce of its own on ``MPI.COMM_WORLD`` (mpisync's own communicator, duplicated at import,
must not take its place), then each worker sends
its result to rank 0 at its own time and ends its script; rank 0 receives with
``source=ANY_SOURCE, tag=ANY_TAG`` on ``MPI.COMM_WORLD``, so any message mpisync sent there (a
departure note of a worker that has already ended) would reach it. Rank 0 prints
``got RESULTS`` (sorted), the worker ranks print ``worker R sent``.
"""

import time

import numpy as np
from mpi4py import MPI

import mpisync

comm = MPI.COMM_WORLD
params = {"w": np.full(64, float(comm.rank), dtype=np.float32)}
mpisync.sync_params(params, comm)
assert params["w"][0] == 0.0
total = np.zeros(1, dtype=np.int64)
comm.Iallreduce(np.array([comm.rank + 1], dtype=np.int64), total).Wait()
assert total[0] == comm.size * (comm.size + 1) // 2, total

if comm.rank == 0:
    results = []
    status = MPI.Status()
    for _ in range(comm.size - 1):
        result = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
        assert status.Get_tag() == 7, status.Get_tag()
        results.append((status.Get_source(), result))
        # the first workers have ended their scripts by now (their departure notes sent)
        time.sleep(0.5)
    print(f"got {sorted(results)}", flush=True)
else:
    time.sleep(0.6 * (comm.rank - 1))  # worker 1 at once, the others later
    comm.send(f"result of {comm.rank}", 0, tag=7)
    print(f"worker {comm.rank} sent", flush=True)
