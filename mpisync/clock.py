"""One deadline helper for every wait, and a timeline that costs nothing when tracing is off."""

from __future__ import annotations

import sys as _sys
import time as _time

from . import config as _config
from .errors import SyncTimeoutError
from .ring import wait_request

__all__ = ["Deadline", "Trace", "timed_out"]

# Seconds between writing a timeout diagnostic and aborting, so the launcher
# forwards the message before it tears the job down.
_ABORT_GRACE_SECONDS = 1.0


class Deadline:
    """Each wait of a sync may last ``timeout`` seconds (``None``: forever): :meth:`at` gives the
    deadline of a wait starting now, :meth:`wait` waits for one MPI request within it."""

    __slots__ = ("timeout", "report")

    def __init__(self, timeout: float | None, report=None):
        self.timeout = timeout
        self.report = report  # a SyncReport whose ``collectives`` counts the requests waited for

    def at(self) -> float | None:
        """The monotonic time by which a wait starting now must end, or ``None``."""
        return None if self.timeout is None else _time.monotonic() + self.timeout

    def wait(self, request) -> None:
        """Wait for ``request``; raises :class:`~mpisync.ring.Expired` past the deadline."""
        if self.report is not None:
            self.report.collectives += 1
        wait_request(request, self.at())


class Trace:
    """A timeline (``mpisync.observe.Timeline``) or nothing: spans are dropped when ``active`` is None."""

    __slots__ = ("active",)

    def __init__(self, timeline=None):
        self.active = timeline

    def now(self) -> int:
        """Microseconds on the timeline's clock (0 when tracing is off)."""
        return self.active.now() if self.active is not None else 0

    def span(self, name: str, start_us: int, **args) -> None:
        """Record a span from ``start_us`` to now."""
        if self.active is not None:
            self.active.span(name, start_us, **args)

    def flush(self) -> None:
        """Write what was recorded."""
        if self.active is not None:
            self.active.flush()


def timed_out(comm, phase: str, pending: list, timeout: float) -> None:
    """Report that the ``phase`` of a sync on ``comm`` outlived ``timeout``: abort the job (the default:
    MPI cannot cancel a collective) after writing the message to stderr, or raise
    :class:`~mpisync.SyncTimeoutError` carrying ``phase`` and ``pending`` (``MPISYNC_TIMEOUT_ABORT=0``)."""
    shown = ", ".join(repr(n) for n in pending[:20])
    if len(pending) > 20:
        shown += f", ... and {len(pending) - 20} more"
    message = (
        f"mpisync: rank {comm.rank} of {comm.size}: the {phase} did not complete within "
        f"{timeout:g} s; pending parameter(s): {shown or 'none'}. Another rank may not have "
        "called sync, may have died, or may be stuck elsewhere."
    )
    if _config.abort_on_timeout():
        _sys.stderr.write(
            f"SyncTimeoutError: {message}\nmpisync: MPI cannot cancel a collective, so rank "
            f"{comm.rank} aborts the job (set MPISYNC_TIMEOUT_ABORT=0 to raise instead).\n"
        )
        _sys.stderr.flush()
        _time.sleep(_ABORT_GRACE_SECONDS)
        comm.Abort(1)
    raise SyncTimeoutError(message, phase=phase, pending=list(pending))
