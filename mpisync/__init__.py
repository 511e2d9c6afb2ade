"""mpisync: keep model parameters identical across the ranks of an MPI job.

>>> from mpi4py import MPI
>>> import mpisync
>>> report = mpisync.sync_params(model.state_dict(), MPI.COMM_WORLD, root=0)  # doctest: +SKIP
"""

__version__ = "0.1.0"

# First: without an MPI library, one ImportError that says what to install. The ``mpisync``
# command alone goes on (its --version, --help and info run without MPI).
from ._runtime import mpilib as _mpilib  # noqa: I001

if _mpilib.PROBLEM is not None and _mpilib.started_as_command():
    __all__: list[str] = []  # the command's --version, --help and info, without MPI
else:
    _mpilib.require()
    from ._runtime import failfast as _failfast
    from ._runtime.ring import RequestRing
    from .allreduce import GradOverlap, GradSync, allreduce
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

    __all__ = [
        "sync_params",
        "sync_state",
        "allreduce",
        "GradSync",
        "GradOverlap",
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
