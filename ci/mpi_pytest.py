"""Run pytest on every rank of an mpiexec job; only rank 0's report goes to stdout.

Other ranks write their stdout to ``$MPISYNC_TEST_LOGS/rank<N>.log`` (default
``.test-logs``); their stderr stays visible, so a failure on any rank (which
aborts the job, see tests/conftest.py) is printed where CI shows it.

Only the tests marked ``mpi`` run (the others are the plain pass's: they would run once per rank
to no end); a ``-m EXPR`` of the caller's replaces that (``-m ""``: every test).
"""

import os
import sys

import pytest
from mpi4py import MPI

rank = MPI.COMM_WORLD.rank
if rank > 0:
    logs = os.environ.get("MPISYNC_TEST_LOGS", ".test-logs")
    os.makedirs(logs, exist_ok=True)
    fd = os.open(
        os.path.join(logs, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
    )
    os.dup2(fd, 1)
    sys.stdout = os.fdopen(1, "w", buffering=1)
code = pytest.main(["--with-mpi", "--only-mpi", "-m", "mpi", *sys.argv[1:]])
sys.stdout.flush()
# All ranks agree on the outcome, so no rank exits while another still waits.
status = MPI.COMM_WORLD.allreduce(int(code != 0), op=MPI.MAX)
sys.exit(int(code) if code != 0 else status)
