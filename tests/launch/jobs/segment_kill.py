"""A rank killed (SIGKILL) while the node's shared segment is set up, after root created its file.

``python segment_kill.py kill``: the last rank kills itself as it opens root's file; the launcher
then ends the job, root included, before anyone unlinked the file. ``python segment_kill.py
sync``: a plain sync through the segment (its set-up removes the files of dead creators).
"""

import os
import signal
import sys

import numpy as np
from mpi4py import MPI

import mpisync
from mpisync.transports import nodesegment

comm = MPI.COMM_WORLD
if sys.argv[1] == "kill" and comm.rank == comm.size - 1:
    real_open = nodesegment._os.open

    def open_then_die(path, *args, **kwargs):
        if str(path).startswith("/dev/shm/mpisync-"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_open(path, *args, **kwargs)

    nodesegment._os.open = open_then_die
params = {f"p{i}": np.full(100, comm.rank, np.float32) for i in range(20)}
report = mpisync.sync_params(params, comm, root=0, timeout=30)
assert all((a == 0).all() for a in params.values())
print(f"rank {comm.rank}: {report.channel}", flush=True)
