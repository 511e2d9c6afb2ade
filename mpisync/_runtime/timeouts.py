"""The end of a collective that did not complete in time: one diagnostic, then abort or raise.

MPI cannot cancel a collective, so by default the rank that noticed aborts the
job (the launcher then ends every rank); ``MPISYNC_TIMEOUT_ABORT=0`` raises
:class:`~mpisync.SyncTimeoutError` instead, leaving the collective pending.
"""

from __future__ import annotations

import signal as _signal
import sys as _sys
import time as _time

from .. import config as _config
from ..errors import SyncTimeoutError

__all__ = ["abort_job", "timed_out"]

# Seconds between writing a timeout diagnostic and aborting, so the launcher forwards the message.
_ABORT_GRACE_SECONDS = 1.0
# Seconds MPI_Abort may take before the kernel ends this process (SIGALRM, default action).
_ABORT_BOUND_SECONDS = 10


def timed_out(
    comm,
    phase: str,
    pending: list,
    timeout: float,
    *,
    pending_what: str = "pending",
    call: str = "it",
) -> None:
    """Write the diagnostic of a collective on ``comm`` that did not complete within ``timeout`` s
    (``pending``: the names still in flight), then abort the job (default) or raise
    :class:`~mpisync.SyncTimeoutError` (``MPISYNC_TIMEOUT_ABORT=0``)."""
    shown = ", ".join(repr(n) for n in pending[:20])
    if len(pending) > 20:
        shown += f", ... and {len(pending) - 20} more"
    message = (
        f"mpisync: rank {comm.rank} of {comm.size}: the {phase} did not complete within "
        f"{timeout:g} s (timed out); "
        f"{pending_what}: {shown or 'none'}. Another rank may not have called {call}, may have "
        "died, "
        "or may be stuck elsewhere."
    )
    if _config.abort_on_timeout():
        _sys.stderr.write(
            f"SyncTimeoutError: {message}\nmpisync: MPI cannot cancel a collective, so rank "
            f"{comm.rank} aborts the job (set MPISYNC_TIMEOUT_ABORT=0 to raise instead).\n"
        )
        _sys.stderr.flush()
        _time.sleep(_ABORT_GRACE_SECONDS)
        abort_job(comm)
    raise SyncTimeoutError(message, phase=phase, pending=list(pending))


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
