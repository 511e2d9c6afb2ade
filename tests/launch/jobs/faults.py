"""Jobs that go wrong on purpose: ``python faults.py KIND``, under mpiexec with 3 ranks.

KIND: kill-rank (rank 1 SIGKILLs itself mid-sync, FAULT_AFTER seconds after its first sync),
kill-root
(root does), stall (rank 1 SIGSTOPs itself mid-sync), raise-between (rank 1 raises between two
syncs).
Ranks print "sync N done" as they go; a rank that finishes prints "finished".
"""

import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

import mpisync

kind = sys.argv[1]
comm = MPI.COMM_WORLD
params = {f"layer{i}.weight": np.full(4 << 20, comm.rank, np.float32) for i in range(8)}  # 128 MiB
# the same, as (simulated) device buffers: the staged pipeline
if os.environ.get("FAULT_DEVICE") == "1":
    from mpisync.devices.simulated import SimulatedDeviceArray

    params = {name: SimulatedDeviceArray(array) for name, array in params.items()}
victim = 0 if kind == "kill-root" else 1
syncer = mpisync.ParamSync(comm, root=0, timeout=float(os.environ.get("FAULT_TIMEOUT", "5")))
cross = os.environ.get("FAULT_CROSS") == "1"
if cross:  # cross-memory copies from sync 1
    syncer._prefer("cross-memory")


def strike():
    time.sleep(float(os.environ.get("FAULT_AFTER", "0.3")))
    os.kill(os.getpid(), signal.SIGSTOP if kind == "stall" else signal.SIGKILL)


timed_strike = False  # the victim stops on a timer started after its first sync (below)
# stop right after this rank's copies of sync 3
if comm.rank == victim and kind == "stall" and cross:
    from mpisync.transports import cma as crossmemory

    run, runs = crossmemory.Copies.run, []

    def run_then_stop(copies):
        done = run(copies)
        runs.append(1)
        if len(runs) == 3:
            os.kill(os.getpid(), signal.SIGSTOP)
        return done

    crossmemory.Copies.run = run_then_stop
elif comm.rank == victim and kind != "raise-between":
    timed_strike = True
for n in range(1, 1000):
    syncer.sync(params)
    print(f"rank {comm.rank}: sync {n} done", flush=True)
    if timed_strike and n == 1:
        # Timed from the end of sync 1, not from start-up: on a slow machine a start-up timer can
        # fire before the first sync has duplicated its communicator, which is not "mid-sync".
        threading.Thread(target=strike, daemon=True).start()
    if kind == "raise-between" and comm.rank == victim and n == 2:
        raise RuntimeError("rank 1 failed between two syncs")
print(f"rank {comm.rank}: finished", flush=True)
