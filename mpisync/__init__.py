"""mpisync: keep model parameters identical across the ranks of an MPI job.

>>> from mpi4py import MPI
>>> import mpisync
>>> report = mpisync.sync_params(model.state_dict(), MPI.COMM_WORLD, root=0)  # doctest: +SKIP
"""

# First: without an MPI library, an ImportError that says how to install one.
from ._runtime.mpilib import MPI as _MPI  # noqa: F401, I001
from ._runtime import failfast as _failfast
from ._runtime.ring import RequestRing
from .allreduce import GradSync, allreduce
from .errors import (
    InvalidParamError,
    ManifestMismatchError,
    PeerExitedError,
    SyncError,
    SyncTimeoutError,
    VerificationError,
)
from .horovod import broadcast_optimizer_state, broadcast_parameters
from .report import SyncReport
from .state import sync_state
from .sync import ParamSync, sync_params

# Under a launcher, one rank's uncaught exception or early exit ends the job within seconds
# (MPISYNC_FAIL_FAST=0 turns it off; docs/reliability.md).
_failfast.install()

__version__ = "0.1.0"

__all__ = [
    "sync_params",
    "sync_state",
    "allreduce",
    "GradSync",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "ParamSync",
    "RequestRing",
    "SyncReport",
    "SyncError",
    "ManifestMismatchError",
    "InvalidParamError",
    "SyncTimeoutError",
    "PeerExitedError",
    "VerificationError",
]
