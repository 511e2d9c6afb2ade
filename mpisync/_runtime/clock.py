"""One deadline helper for every wait, and a timeline that costs nothing when tracing is off.

What happens when a deadline passes is :func:`mpisync._runtime.timeouts.timed_out`."""

from __future__ import annotations

import time as _time

from .ring import wait_request

__all__ = ["Deadline", "Trace"]


class Deadline:
    """Each wait of a sync may last ``timeout`` seconds (``None``: forever): :meth:`at` gives the
    deadline of a wait starting now, :meth:`wait` waits for one MPI request within it."""

    __slots__ = ("timeout", "report", "comm")

    def __init__(self, timeout: float | None, report=None, comm=None):
        self.timeout = timeout
        self.report = report  # a SyncReport whose ``collectives`` counts the requests waited for
        self.comm = comm  # whose ranks the waits watch (a rank that left ends them)

    def at(self) -> float | None:
        """The monotonic time by which a wait starting now must end, or ``None``."""
        return None if self.timeout is None else _time.monotonic() + self.timeout

    def wait(self, request) -> None:
        """Wait for ``request``; raises :class:`~mpisync._runtime.ring.Expired` past the
        deadline, or once a rank of ``comm`` has ended its script."""
        if self.report is not None:
            self.report.collectives += 1
        wait_request(request, self.at(), self.comm)


class Trace:
    """A timeline (``mpisync._runtime.observe.Timeline``) or nothing: spans are dropped when
    ``active`` is None."""

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
