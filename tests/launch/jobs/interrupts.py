"""An interrupt inside a call, caught, then the same object called again:
``python interrupts.py KIND WHO K [RAISE]``, under mpiexec with 2 ranks.

KIND: ``param`` (``ParamSync.sync``) or ``grad`` (``GradSync.allreduce``), of 64 x 1 MiB float64.
WHO: ``all`` or a rank: where a ``KeyboardInterrupt`` is raised at the K-th poll of a request still
in flight (the wait loop's test hook; a rank not chosen starts its call late, so the chosen one
waits); with RAISE ``exit``, ``SystemExit`` (what a SIGTERM handler
of a preempted job raises). The ranks not interrupted wait out the timeout
(``MPISYNC_TIMEOUT_ABORT=0``: they raise). Then each rank fills fresh memory with a pattern while
MPI progresses (barriers), checks the pattern, calls the same object again (which must raise
``SyncError``), and syncs with a fresh object. Rank 0 prints one line ``rank R: ...`` per rank
of what happened; any other outcome is an uncaught exception.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import mpisync
from mpisync._runtime import ring

kind, who, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
interrupt = SystemExit if sys.argv[4:] == ["exit"] else KeyboardInterrupt
comm = MPI.COMM_WORLD
rank = comm.rank
TIMEOUT = 4.0
ELEMENTS = (1 << 20) // 8  # 1 MiB of float64


def fresh_params():
    return {f"w{i:02d}": np.full(ELEMENTS, rank + 1.0 + i) for i in range(64)}


def make():
    if kind == "param":
        return mpisync.ParamSync(comm, timeout=TIMEOUT)
    return mpisync.GradSync(comm, timeout=TIMEOUT)


def call(obj, params):
    return obj.sync(params) if kind == "param" else obj.allreduce(params)


def expected(i):
    if kind == "param":
        return 1.0 + i  # root's values
    return sum(r + 1.0 + i for r in range(comm.size))


params = fresh_params()
obj = make()
call(obj, params)  # a first call that completes: the next one reuses everything
params = fresh_params()
polls = [0]


def interrupt_at_k():
    polls[0] += 1
    if polls[0] == k:
        raise interrupt


if who == "all" or int(who) == rank:
    ring._poll_hook = interrupt_at_k
else:
    time.sleep(0.5)
try:
    call(obj, params)
    outcome = "completed"
except interrupt:
    outcome = "interrupted"
except mpisync.SyncError as exc:  # a rank not interrupted: its wait timed out
    outcome = type(exc).__name__
ring._poll_hook = None

# Memory freed under MPI would be handed out again here, and MPI's late writes would land in it.
junk = []
for round_ in range(8):
    junk.append([np.full(ELEMENTS, -7.0 - round_) for _ in range(64)])
    comm.Barrier()
intact = all((a == -7.0 - r).all() for r, arrays in enumerate(junk) for a in arrays)

try:
    call(obj, fresh_params())
    reuse = "no error"
except mpisync.SyncError as exc:
    reuse = f"{type(exc).__name__}: {exc}"
obj.close()

comm.Barrier()
again = fresh_params()
with make() as new:
    call(new, again)
right = all((a == expected(i)).all() for i, a in enumerate(again.values()))
said = comm.gather(
    f"rank {rank}: outcome={outcome} polls={polls[0]} intact={intact} right={right} reuse={reuse}"
)
if rank == 0:  # one writer: the ranks' lines never interleave
    print("\n".join(said), flush=True)
