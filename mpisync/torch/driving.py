"""Who waits in MPI (:class:`Driver`): one driver at a time, the requests it waits for, the wake
request that interrupts its wait, and the worker thread that drives when nobody waits but
somebody will. The module docstring of :mod:`mpisync.torch.engine` tells the whole story."""

from __future__ import annotations

import threading as _threading
import time as _time
import typing as _typing

from .entry import Entry
from .ledger import Ledger

__all__ = ["Driver"]

# How long a caller that found nothing in flight (its operation about to be posted by another
# thread) sleeps before it looks again.
_IDLE_SECONDS = 0.01


class Completions(_typing.Protocol):
    """What the driver reports to the engine (:class:`~mpisync.torch.engine.Engine`)."""

    def completed(self, entry: Entry, status, error) -> None:
        """One of ``entry``'s requests completed (with ``error``, if MPI reported one)."""

    def overdue(self) -> None:
        """Report a timeout if the oldest operation's deadline passed."""


class Driver:
    """Waiting in MPI for the operations of ``ledger`` through ``mpi``'s calls. ``cond`` (callers
    wait on it) and ``worker_cond`` (the worker waits on it) share the engine's ``lock``, which
    guards this object's fields too."""

    def __init__(
        self,
        engine: Completions,
        mpi,
        lock,
        cond: _threading.Condition,
        worker_cond: _threading.Condition,
        ledger: Ledger,
    ):
        self._engine, self._mpi, self._ledger = engine, mpi, ledger
        self._lock, self._cond, self._worker_cond = lock, cond, worker_cond
        self.waiting: dict = {}  # id(request) -> (request, its entry, its index in its step)
        self._driving: _threading.Thread | None = None  # the driver: it waits in MPI
        self._depth = 0  # the driver's nesting (a future's callback may wait, and so drive)
        self._in_mpi = False  # the driver is inside waitany: wake it to add requests
        self._woken = False
        self.threaded = mpi.threaded()
        self._wake = mpi.wake() if self.threaded else None
        self._worker: _threading.Thread | None = None
        self._halted = False  # the process exits: the worker ends at its next look

    def start(self) -> None:
        """Start the worker, where callers may post while it waits (``MPI_THREAD_MULTIPLE``)."""
        if self.threaded:
            self._worker = _threading.Thread(target=self._run, name="mpisync-worker", daemon=True)
            self._worker.start()

    # -- what the engine tells the driver (each with the lock held) -------------------------------
    def add(self, entry: Entry, requests: list) -> None:
        """Wait for ``entry``'s newly posted ``requests`` too."""
        for index, request in enumerate(requests):
            self.waiting[id(request)] = (request, entry, index)
        if requests and self._in_mpi:
            self.nudge()  # the driver adds them to its wait

    def drop(self, entry: Entry) -> list:
        """Stop waiting for ``entry``'s requests; return them (MPI may still use them)."""
        keys = [k for k, pair in self.waiting.items() if pair[1] is entry]
        return [self.waiting.pop(key)[0] for key in keys]

    def abandon(self) -> list:
        """Stop waiting for every request; return them (MPI may still use them)."""
        requests = [pair[0] for pair in self.waiting.values()]
        self.waiting.clear()
        if self._in_mpi:
            self.nudge()  # the driver stops waiting for what was abandoned
        self.call_worker()
        return requests

    def nudge(self) -> None:
        """Interrupt the driver's wait in MPI."""
        if not self._woken and self._wake is not None:  # no wake: no thread but the driver posts
            self._woken = True
            self._wake.Complete()

    def call_worker(self) -> None:
        """Have the worker look whether it is due."""
        self._worker_cond.notify()

    def stop(self) -> None:
        """The engine shuts down: the driver stops waiting, the worker finishes what is due."""
        if self._in_mpi:
            self.nudge()
        self._worker_cond.notify()

    def join(self) -> None:
        """Wait for the worker to end (call without the lock)."""
        if self._worker is not None:
            self._worker.join()

    def halt(self, seconds: float) -> None:
        """The process exits: the worker ends after the step it is in, leaving what is in flight
        (call without the lock); wait at most ``seconds`` for it to end."""
        with self._lock:
            self._halted = True
            if self._in_mpi:
                self.nudge()
            self._worker_cond.notify()
        worker = self._worker
        if worker is not None and worker is not _threading.current_thread():
            worker.join(seconds)

    # -- the driver token -------------------------------------------------------------------------
    def _acquire(self) -> bool:
        """Become the driver (again, from a future's callback), unless another thread is."""
        me = _threading.current_thread()
        with self._lock:
            if self._driving is not None and self._driving is not me:
                return False
            self._driving = me
            self._depth += 1
            return True

    def _release(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._driving = None
                self._cond.notify_all()  # callers waiting for the token
                if self._ledger.due():
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
            with self._lock:
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
        with self._lock:
            if not self.waiting:
                return False
            pairs = list(self.waiting.values())
            requests = [pair[0] for pair in pairs]
            deadline = end
            if self.threaded:
                requests.insert(0, self._wake)  # the worker completes it at a deadline
            elif self._ledger.entries:
                oldest = self._ledger.oldest().deadline  # type: ignore[union-attr]
                deadline = oldest if end is None or (oldest is not None and oldest < end) else end
            self._in_mpi = True
        booked = None  # a completion booked and not yet reported to the engine
        try:
            index, status, error = self._mpi.waitany(requests, deadline)  # the one wait on MPI
            with self._lock:
                self._in_mpi = False
                if self.threaded and index >= 0:
                    if index == 0:
                        self._wake, self._woken = self._mpi.wake(), False
                    index -= 1
                if index >= 0:  # one request of an entry: its bookkeeping, under the same lock
                    request, entry, position = pairs[index]
                    if not self._record(request, entry, position, status):
                        return True  # abandoned meanwhile (the engine broke)
                    booked = (entry, status, error)
        except BaseException:
            # An interrupt (KeyboardInterrupt, a signal handler's SystemExit) left the wait: what
            # MPI completed meanwhile is booked and reported as if the wait had returned it, so
            # that every operation still completes and its buffers stay held until it does; the
            # caller sees the interrupt, the operations stay in flight.
            self._recover(pairs, booked)
            raise
        if index < 0:  # woken, or a deadline passed
            self._engine.overdue()
            return end is None or _time.monotonic() < end
        self._engine.completed(*booked)  # type: ignore[misc]
        return True

    def _record(self, request, entry: Entry, position: int, status) -> bool:
        """Book one completed request of ``entry`` (the lock held); False if it was abandoned
        meanwhile (the engine broke)."""
        if self.waiting.pop(id(request), None) is None:
            return False
        entry.outstanding -= 1
        if entry.p2p:
            entry.statuses[position] = status
        return True

    def _recover(self, pairs: list, booked: tuple | None) -> None:
        """After an exception left :meth:`_progress`: the wait is over; the completion it
        ``booked``, and a request of ``pairs`` that MPI completed (freed) without its completion
        being booked, are reported now; a completed wake request is replaced."""
        finished = getattr(self._mpi, "finished", None)  # a fake MPI of the unit tests may lack it
        found = [] if booked is None else [booked]
        with self._lock:
            self._in_mpi = False
            if finished is not None:
                if self._wake is not None and finished(self._wake):
                    self._wake, self._woken = self._mpi.wake(), False
                for request, entry, position in pairs:
                    if id(request) in self.waiting and finished(request):
                        status = self._mpi.status_of(request)
                        if self._record(request, entry, position, status):
                            found.append((entry, status, None))
        for entry, status, error in found:
            self._engine.completed(entry, status, error)

    # -- the worker -------------------------------------------------------------------------------
    def _run(self) -> None:
        ledger = self._ledger
        while True:
            with self._lock:
                while not ledger.due():
                    if ledger.over() or self._halted:
                        return
                    self._worker_cond.wait(ledger.pause())
                if self._halted:
                    return
                if ledger.late() and self._in_mpi:
                    self.nudge()  # a caller drives: it reports the timeout
            if not self._acquire():
                with self._lock:
                    if self._driving is not None:
                        self._worker_cond.wait(ledger.sweep)
                continue
            try:
                self._engine.overdue()
                while True:
                    with self._lock:
                        if not ledger.due() or self._halted:
                            break
                    if not self._progress(None):
                        break
            finally:
                self._release()
