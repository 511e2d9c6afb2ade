"""Ending the whole job from one rank (``MPI_Abort``), bounded: for a timeout
(:mod:`mpisync._runtime.timeouts`) and for an uncaught exception
(:mod:`mpisync._runtime.failfast`)."""

from __future__ import annotations

import signal as _signal

__all__ = ["abort_job"]

# Seconds MPI_Abort may take before the kernel ends this process (SIGALRM, default action).
_ABORT_BOUND_SECONDS = 10


def abort_job(comm) -> None:
    """``MPI_Abort`` on ``comm``, bounded: should the abort itself not return control to the
    launcher
    (seen now and then with the embedded MPICH), the kernel ends this process after
    ``_ABORT_BOUND_SECONDS``, and the launcher, seeing a rank killed, ends the others."""
    try:
        if _signal.getsignal(_signal.SIGALRM) in (_signal.SIG_DFL, None):
            # a signal, not a thread: it fires even if Abort holds the GIL
            _signal.alarm(_ABORT_BOUND_SECONDS)
    except (AttributeError, ValueError):  # no SIGALRM on this platform
        pass
    comm.Abort(1)
