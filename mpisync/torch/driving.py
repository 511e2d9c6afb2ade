"""The completing side of the engine (:class:`Driving`, mixed into
:class:`~mpisync.torch.engine.Engine`): who waits in MPI, what happens when a request completes,
deadlines, and how the engine breaks. The module docstring of :mod:`mpisync.torch.engine` tells
the whole story."""

from __future__ import annotations

import threading as _threading
import time as _time
import typing as _typing

from mpi4py import MPI

from .._runtime.keepalive import keep_alive
from .entry import Entry, settle
from .errors import CountError, OperationError, OperationTimeoutError

__all__ = ["Driving"]

# How long a caller that found nothing in flight (its operation about to be posted by another
# thread) sleeps before it looks again.
_IDLE_SECONDS = 0.01


class Driving:
    """Waiting in MPI (one driver at a time), completions, deadlines, breaking."""

    # Engine's: set by its __init__
    comm: _typing.Any
    threaded: bool
    _mpi: _typing.Any
    _cond: _threading.Condition
    _worker_cond: _threading.Condition
    _driving: _threading.Thread | None
    _depth: int
    _waiting: dict
    _entries: dict
    _queue: list
    _in_flight: int
    _futures: int
    _draining: int
    _broken: str | None
    _closing: bool
    _in_mpi: bool
    _wake: _typing.Any
    _woken: bool
    _sweep: float
    _worker: _threading.Thread | None
    _on_timeout: _typing.Callable[[list], str]
    _advance: _typing.Callable
    _pump: _typing.Callable[[], None]
    _nudge: _typing.Callable[[], None]

    # -- the driver token -------------------------------------------------------------------------
    def _acquire(self) -> bool:
        """Become the driver (again, from a future's callback), unless another thread is."""
        me = _threading.current_thread()
        with self._cond:
            if self._driving is not None and self._driving is not me:
                return False
            self._driving = me
            self._depth += 1
            return True

    def _release(self) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._driving = None
                self._cond.notify_all()  # callers waiting for the token
                if self._due():
                    self._worker_cond.notify()

    # -- waiting ----------------------------------------------------------------------------------
    def wait(self, entry: Entry, timeout: float | None = None) -> bool:
        """Wait until ``entry`` is done, driving when nobody else does; False if ``timeout``
        seconds passed first."""
        end = None if timeout is None else _time.monotonic() + timeout
        while not entry.done:
            progressed = True
            if self._acquire():
                try:
                    progressed = self._drive(entry, end)
                finally:
                    self._release()
            left = None if end is None else end - _time.monotonic()
            if entry.done:
                break
            if left is not None and left <= 0:
                return False
            with self._cond:
                if entry.done:
                    break
                if self._driving is not None:
                    self._cond.wait(left)  # the driver completes it, or lets go
                elif not progressed:
                    self._cond.wait(_IDLE_SECONDS if left is None else min(left, _IDLE_SECONDS))
        return True

    def _drive(self, entry: Entry, end: float | None) -> bool:
        """Complete operations until ``entry`` is done; False if nothing was in flight."""
        while not entry.done:
            if not self._progress(end):
                return False
        return True

    def _progress(self, end: float | None) -> bool:
        """Wait for one request (or a wake, or a deadline) and act on it; False: nothing in
        flight, or ``end`` passed."""
        with self._cond:
            if not self._waiting:
                return False
            pairs = list(self._waiting.values())
            requests = [pair[0] for pair in pairs]
            deadline = end
            if self.threaded:
                requests.insert(0, self._wake)  # the worker completes it at a deadline
            elif self._entries:
                oldest = next(iter(self._entries.values())).deadline
                deadline = oldest if end is None or (oldest is not None and oldest < end) else end
            self._in_mpi = True
        index, status, error = self._mpi.waitany(requests, deadline)  # the one wait on MPI
        with self._cond:
            self._in_mpi = False
            if self.threaded and index >= 0:
                if index == 0:
                    self._wake, self._woken = self._mpi.wake(), False
                index -= 1
            if index >= 0:  # one request of an entry: its bookkeeping, under the same lock
                request, entry, position = pairs[index]
                if self._waiting.pop(id(request), None) is None:
                    return True  # abandoned meanwhile (the engine broke)
                entry.outstanding -= 1
                if entry.p2p:
                    entry.statuses[position] = status
        if index < 0:  # woken, or a deadline passed
            self._overdue()
            return end is None or _time.monotonic() < end
        self._completed(entry, status, error)
        return True

    def _completed(self, entry: Entry, status, error) -> None:
        """One of ``entry``'s requests completed (with ``error``, if MPI reported one)."""
        if error is None:
            if entry.outstanding == 0:
                self._advance(entry, entry.statuses)
            return
        if not entry.p2p:
            self._break(f"MPI error in {entry.label}: {error}", entry)
            return
        with self._cond:  # only this operation failed: the collectives' sequence is intact
            for key in [k for k, pair in self._waiting.items() if pair[1] is entry]:
                keep_alive(self._waiting.pop(key)[0])
        truncated = getattr(error, "Get_error_class", lambda: None)() == MPI.ERR_TRUNCATE
        kind = CountError if truncated else OperationError
        rank = getattr(self.comm, "rank", "?")
        self._finish(entry, kind(f"mpisync: rank {rank}: MPI error in {entry.label}: {error}"))

    def _finish(self, entry: Entry, error: BaseException | None) -> None:
        with self._cond:
            if self._entries.pop(id(entry), None) is None:
                return  # finished already (failed with the engine)
            freed = entry.started and not entry.p2p
            if freed:
                self._in_flight -= 1
            if entry.counted:
                self._futures -= 1
            entry.error, entry.done = error, True
            if error is None:
                entry.steps = None  # done with: the buffers its frame held may go
            future = entry.future
            self._cond.notify_all()  # its waiters
        if future is not None:
            settle(entry, future)  # its callbacks run here
        if freed:
            self._pump()  # room for the next collective

    # -- the worker -------------------------------------------------------------------------------
    def _due(self) -> bool:
        """Whether the worker should drive (call with ``_cond`` held): something is pending that a
        future, a drain or a shutdown waits for, or that nobody has waited for a while."""
        if not self._entries or self._broken is not None:
            return False
        if self._futures or self._draining or self._closing:
            return True
        oldest = next(iter(self._entries.values()))
        return _time.monotonic() >= oldest.posted + self._sweep or self._late()

    def _late(self) -> bool:
        oldest = next(iter(self._entries.values()), None)
        return (
            oldest is not None
            and oldest.deadline is not None
            and (_time.monotonic() >= oldest.deadline)
        )

    def _pause(self) -> float:
        """How long the idle worker sleeps before it looks again."""
        oldest = next(iter(self._entries.values()), None)
        if oldest is None:
            return self._sweep
        until = oldest.posted + self._sweep
        if oldest.deadline is not None:
            until = min(until, oldest.deadline)
        return max(0.001, until - _time.monotonic())

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due():
                    if not self._entries and (self._closing or self._broken is not None):
                        return
                    self._worker_cond.wait(self._pause())
                if self._late() and self._in_mpi:
                    self._nudge()  # a caller drives: it reports the timeout
            if not self._acquire():
                with self._cond:
                    if self._driving is not None:
                        self._worker_cond.wait(self._sweep)
                continue
            try:
                self._overdue()
                while True:
                    with self._cond:
                        if not self._due():
                            break
                    if not self._progress(None):
                        break
            finally:
                self._release()

    # -- deadlines and failures -------------------------------------------------------------------
    def _overdue(self) -> None:
        """Report a timeout if the oldest operation's deadline passed (called by the driver)."""
        with self._cond:
            if not self._late() or self._broken is not None:
                return
            labels = [e.label for e in self._entries.values()]
        message = self._on_timeout(labels)  # aborts the job unless MPISYNC_TIMEOUT_ABORT=0
        error = OperationTimeoutError(message, phase="torch.distributed operation", pending=labels)
        self._break(f"an operation timed out ({message})", None, error)

    def _break(
        self, reason: str, culprit: Entry | None, error: BaseException | None = None
    ) -> None:
        """Fail every pending operation; keep whatever MPI may still use alive."""
        with self._cond:
            if self._broken is None:
                self._broken = reason
            failed = list(self._entries.values())
            keep_alive(*failed, *(pair[0] for pair in self._waiting.values()))
            self._waiting.clear()
            self._queue.clear()
            if self._in_mpi:
                self._nudge()  # the driver stops waiting for what was abandoned
            self._cond.notify_all()
            self._worker_cond.notify()
        if error is None:
            rank = getattr(self.comm, "rank", "?")
            error = OperationError(
                f"mpisync: rank {rank}: {reason}; this process group is unusable (its "
                "collectives may no longer match the other ranks')"
            )
        for entry in ([culprit] if culprit is not None else []) + failed:
            self._finish(entry, error)
