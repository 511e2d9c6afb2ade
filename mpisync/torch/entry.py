"""One operation of the engine (:class:`Entry`), and the MPI calls the engine makes
(:class:`MpiCalls`, replaced by a fake in the unit tests)."""

from __future__ import annotations

import os as _os
import time as _time

import torch
from mpi4py import MPI

from .._runtime import failfast as _failfast

# While a deadline is set (below MPI_THREAD_MULTIPLE, where the caller polls), it spins, then
# sleeps between tests, as every polling wait does: MPI progresses only inside MPI calls.
from .._runtime.spin import SLEEP_SECONDS as _SLEEP_SECONDS
from .._runtime.spin import SPIN_SECONDS as _SPIN_SECONDS

__all__ = ["Entry", "MpiCalls", "settle"]


class MpiCalls:
    """What the engine asks of MPI: one wait for any of several requests, and the wake request a
    caller completes to interrupt that wait. A rank of ``comm`` that ended its script ends a wait
    as a deadline does (:mod:`mpisync._runtime.failfast`)."""

    def __init__(self, comm=None):
        self.comm = comm
        self._status = None  # the status the last wait filled in

    def finished(self, request) -> bool:
        """Whether MPI completed and freed ``request`` (a wait or test sets it to null)."""
        return request == MPI.REQUEST_NULL

    def status_of(self, request):
        """The status of the request the last :meth:`waitany` completed (``request``), where an
        interrupt left the wait before it returned it."""
        return self._status

    def threaded(self) -> bool:
        """Whether a worker thread may wait while callers post (``MPI_THREAD_MULTIPLE``)."""
        return MPI.Query_thread() == MPI.THREAD_MULTIPLE

    def wake(self):
        """A request that completes when its ``Complete()`` is called (a generalized request)."""
        return MPI.Grequest.Start(_query, _free, _cancel)

    def waitany(self, requests: list, deadline: float | None) -> tuple:
        """``(index, status, error)`` of one completed request; ``(-1, None, None)`` once
        ``time.monotonic()`` passes ``deadline`` or a rank of ``comm`` has left. ``error``: the
        MPI error that request ended with (``MPI.Waitany`` raises it; the request it belonged to
        is the one MPI set to ``MPI.REQUEST_NULL``)."""
        self._status = status = MPI.Status()
        watch = self.comm if self.comm is not None and _failfast.watching() else None
        try:
            if deadline is None and watch is None:
                return MPI.Request.Waitany(requests, status), status, None
            return _poll(requests, status, deadline, watch)
        except MPI.Exception as exc:
            for index, request in enumerate(requests):
                if request == MPI.REQUEST_NULL:
                    return index, status, exc
            raise


def _poll(requests: list, status, deadline: float | None, watch) -> tuple:
    start = _time.monotonic()
    lookout = _failfast.Lookout(watch)
    while True:
        index, done = MPI.Request.Testany(requests, status)
        if done and index != MPI.UNDEFINED:
            return index, status, None
        now = _time.monotonic()
        if (deadline is not None and now >= deadline) or lookout.gone(now):
            return -1, None, None
        if now - start < _SPIN_SECONDS:
            _os.sched_yield()
        else:
            _time.sleep(_SLEEP_SECONDS)


def _query(status, *args) -> None:
    status.Set_source(MPI.UNDEFINED)
    status.Set_tag(MPI.UNDEFINED)
    status.Set_cancelled(False)


def _free(*args) -> None:
    return None


def _cancel(completed, *args) -> None:
    return None


class Entry:
    """One operation: its steps, what is in flight, its outcome and its future (the engine's
    lock guards every field but ``steps``, which only the poster or the driver runs)."""

    __slots__ = (
        "steps",
        "label",
        "result",
        "p2p",
        "posted",
        "deadline",
        "outstanding",
        "statuses",
        "started",
        "last_posted",
        "done",
        "error",
        "future",
        "counted",
    )

    def __init__(self, steps, label: str, result, p2p: bool, deadline: float | None):
        self.steps, self.label, self.result, self.p2p = steps, label, result, p2p
        self.posted, self.deadline = _time.monotonic(), deadline
        self.outstanding = 0  # requests of the current step not yet complete
        self.statuses: list = []  # of a point-to-point operation's requests
        self.started = False  # a collective counted against the cap
        self.last_posted = False
        self.done = False
        self.error: BaseException | None = None
        self.future: torch.futures.Future | None = (
            None  # made when first asked for: a synchronous call never needs one
        )
        self.counted = False  # among the engine's unfinished entries with a future

    def next_step(self, statuses) -> tuple:
        """Post the next step: ``(requests, last)``; ``StopIteration`` once completed."""
        requests, last = self.steps.send(statuses)
        self.last_posted = last
        return requests, last

    def raise_error(self) -> None:
        """Raise what the (finished) operation failed with, if anything."""
        if self.error is not None:
            raise self.error


def settle(entry: Entry, future) -> None:
    """Complete ``future`` with ``entry``'s outcome (runs its callbacks on this thread)."""
    if entry.error is not None:
        future.set_exception(entry.error)
    else:
        future.set_result(entry.result)
