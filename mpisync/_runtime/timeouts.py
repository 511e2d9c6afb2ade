"""The end of a collective that cannot complete (in time, or at all): one diagnostic, then abort
or raise.

MPI cannot cancel a collective, so by default the rank that noticed aborts the
job (the launcher then ends every rank); ``MPISYNC_TIMEOUT_ABORT=0`` raises
:class:`~mpisync.SyncTimeoutError` instead, leaving the collective pending.
"""

from __future__ import annotations

import sys as _sys
import time as _time

from .. import config as _config
from ..errors import PeerExitedError, SyncTimeoutError
from .abort import abort_job
from .failfast import departed_in, describe_departure

__all__ = ["abort_job", "timed_out"]

# Seconds between writing a timeout diagnostic and aborting, so the launcher forwards the message.
_ABORT_GRACE_SECONDS = 1.0


def timed_out(
    comm,
    phase: str,
    pending: list,
    timeout: float | None,
    *,
    pending_what: str = "pending",
    call: str = "it",
) -> None:
    """Write the diagnostic of a collective on ``comm`` that cannot complete (``pending``: the
    names still in flight), then abort the job (default) or raise (``MPISYNC_TIMEOUT_ABORT=0``):
    :class:`~mpisync.PeerExitedError` when a rank of ``comm`` has already ended its script
    (:mod:`mpisync._runtime.failfast`), else :class:`~mpisync.SyncTimeoutError` (it did not
    complete within ``timeout`` s)."""
    shown = ", ".join(repr(n) for n in pending[:20])
    if len(pending) > 20:
        shown += f", ... and {len(pending) - 20} more"
    gone = departed_in(comm)
    where = f"mpisync: rank {comm.rank} of {comm.size}: the {phase}"
    if gone:
        message = f"{where} cannot complete: {describe_departure(comm, gone)}; {pending_what}: "
        message += shown or "none"
        kind: type[SyncTimeoutError] = PeerExitedError
    else:
        message = (
            f"{where} did not complete within {timeout:g} s (timed out); "
            f"{pending_what}: {shown or 'none'}. Another rank may not have called {call}, may "
            "have died, or may be stuck elsewhere."
        )
        kind = SyncTimeoutError
    if _config.abort_on_timeout():
        _sys.stderr.write(
            f"{kind.__name__}: {message}\nmpisync: MPI cannot cancel a collective, so rank "
            f"{comm.rank} aborts the job (set MPISYNC_TIMEOUT_ABORT=0 to raise instead).\n"
        )
        _sys.stderr.flush()
        _time.sleep(_ABORT_GRACE_SECONDS)
        abort_job(comm)
    if kind is PeerExitedError:
        raise PeerExitedError(message, phase=phase, pending=list(pending), ranks=gone)
    raise SyncTimeoutError(message, phase=phase, pending=list(pending))
