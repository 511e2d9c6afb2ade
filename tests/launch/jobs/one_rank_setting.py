"""An invalid setting in one rank's environment only: ``python one_rank_setting.py NAME VALUE``,
under mpiexec with 2 ranks.

Rank 1 sets ``NAME=VALUE`` before creating a ``ParamSync`` and a ``GradSync`` (timeout 60 s); each
is called once on every rank. Rank 0 prints one line per rank and object:
``rank R KIND: ERROR-CLASS: MESSAGE (S s)``.
"""

import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpisync

name, value = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
if comm.rank == 1:
    os.environ[name] = value
params = {"w": np.full(1000, comm.rank + 1.0)}
lines = []
for kind in ("ParamSync", "GradSync"):
    obj = (
        mpisync.ParamSync(comm, timeout=60)
        if kind == "ParamSync"
        else mpisync.GradSync(comm, timeout=60)
    )
    start = time.monotonic()
    try:
        obj.sync(params) if kind == "ParamSync" else obj.allreduce(params)
        outcome = "no error"
    except mpisync.SyncError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    lines.append(f"rank {comm.rank} {kind}: {outcome} ({time.monotonic() - start:.1f} s)")
    obj.close()
said = comm.gather("\n".join(lines))
if comm.rank == 0:  # one writer: the ranks' lines never interleave
    print("\n".join(said), flush=True)
