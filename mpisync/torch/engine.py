"""The progress engine of the torch backend: operations in a FIFO queue, one driver in MPI.

- **An operation is a generator of steps.** Each step posts requests (the
  argument check, then the data movement; a sparse all-reduce has a third) and
  yields ``(requests, last)``; the code after its last yield is its completion
  (copies back, ``avg``'s division), run once those requests are done.
- **Posting.** Collectives must be posted in the same order on every rank (MPI's
  rule for one communicator), so only the oldest operation with steps left to
  post may post, and a new one starts only while fewer than ``capacity``
  collectives are in flight. Nobody waits for room: an operation issued beyond
  the cap waits in the queue and is posted when an earlier one completes, so the
  cap never blocks a caller and cannot deadlock a valid program. Point-to-point
  operations are posted at once and never counted.
- **Completing: one driver at a time.** Whoever holds the driver token waits in
  MPI (``waitany``, which releases the GIL) for any request in flight and acts
  on what completes; nobody else waits on or tests a request. A caller that
  waits for its operation drives itself when the token is free (a synchronous
  collective wakes no thread and hands nothing between threads); otherwise it
  sleeps until the driver finished its operation. The worker thread drives when
  nobody waits but somebody will: a future was asked for (DDP's buckets, its
  communication hooks), a drain or a shutdown waits, or an operation is older
  than the sweep period (nobody waits for it, its buffers should still go). The
  driver's wait includes a wake request, completed when a request is posted
  meanwhile or a deadline passes. The MPI calls are injected (:class:`MpiCalls`),
  so unit tests drive completion orders, timeouts and failures without MPI.
- **Failures**: an operation's own error (ranks
  that disagreed in the argument check, a receive of the wrong size) fails that
  operation. An MPI error in a collective, or a collective that failed while
  posting, breaks the engine: every pending operation fails and later ones raise
  at once (this rank's collectives may no longer match the other ranks'). A
  timeout (an operation older than ``timeout``) is reported by ``on_timeout``,
  which aborts the job by default; otherwise every pending operation fails with
  its message. Requests that may still be in flight keep their buffers alive.
- **Interrupts**: an exception that leaves a wait (``KeyboardInterrupt``, a signal handler's
  ``SystemExit``) leaves every operation in flight and the engine consistent (what MPI completed
  meanwhile is booked as if the wait had returned it): waiting again completes them. A step that
  raises while posting keeps what its frame held alive (MPI may use it).
- **Futures** are settled on settler threads where a worker drives
  (:mod:`mpisync.torch.settling`): a future's callback may issue a collective and
  wait for it (PowerSGD), which the driver's own thread could never complete.

Below ``MPI_THREAD_MULTIPLE`` there is no worker: collectives complete on the
calling thread before the call returns, point-to-point operations when waited
for, under the same deadlines.
"""

from __future__ import annotations

import atexit as _atexit
import contextlib as _contextlib
import threading as _threading
import time as _time
import typing as _typing
import weakref as _weakref

import torch
from mpi4py import MPI

from .._runtime.failfast import departed_in
from .._runtime.keepalive import keep_alive
from .._runtime.observe import timeline_for
from .driving import Driver
from .entry import Entry, MpiCalls, settle
from .errors import AgreedError, CountError, OperationError, OperationTimeoutError
from .ledger import Ledger
from .settling import Settler

__all__ = ["Engine", "Entry", "MpiCalls"]

# Seconds the exit waits for each engine's threads to end (they end after the step they are in).
_HALT_SECONDS = 2.0
_LIVE: _weakref.WeakSet = _weakref.WeakSet()


class Engine:
    """Operations on ``comm``: at most ``capacity`` collectives in flight, each within
    ``timeout`` seconds (``None``: no limit); ``on_timeout(labels) -> message`` reports (and
    aborts the job unless ``MPISYNC_TIMEOUT_ABORT=0``)."""

    def __init__(self, comm, capacity: int, timeout: float | None, on_timeout, mpi=None):
        self.comm = comm
        self._capacity = capacity
        self._timeout = timeout
        self._on_timeout = on_timeout
        # The lock guards the state below; callers wait on the condition. ``with self._lock``,
        # not ``with self._cond``: the same lock without two Python-level calls around it.
        self._lock = lock = _threading.Lock()
        self._cond = _threading.Condition(lock)
        self._post_lock = _threading.RLock()  # one poster at a time: the issue order
        self._queue: list = []  # collectives with steps left to post, oldest first
        self._ledger = Ledger(timeout)
        mpi = MpiCalls(comm) if mpi is None else mpi
        self._driver = Driver(self, mpi, lock, self._cond, _threading.Condition(lock), self._ledger)
        self.threaded = self._driver.threaded
        self._settler = Settler(settle) if self.threaded else None
        self._timeline = timeline_for(MPI.COMM_WORLD.rank)  # MPISYNC_TIMELINE: a span per operation
        self._driver.start()
        _LIVE.add(self)

    # -- submitting and posting -------------------------------------------------------------------
    def submit(self, steps: _typing.Generator, label: str, result=None, p2p: bool = False) -> Entry:
        """Start the operation ``steps`` (see the module's docstring); return its entry."""
        deadline = None if self._timeout is None else _time.monotonic() + self._timeout
        entry = Entry(steps, label, result, p2p, deadline)
        with self._lock:
            self._ledger.check()
            self._ledger.add(entry)
            if not p2p:
                self._queue.append(entry)
        if p2p:
            self._advance(entry)
        else:
            self._pump()
        if not self.threaded and not p2p:  # p2p: when waited for (the peer may post later)
            self.wait(entry)
        return entry

    def _pump(self) -> None:
        """Start what the queue's order and the cap allow."""
        # Read without the lock: whoever appends to the queue pumps after appending.
        while self._queue:
            with self._post_lock:
                with self._lock:
                    if not self._queue or self._ledger.broken is not None:
                        return
                    head = self._queue[0]
                    if head.started or self._ledger.in_flight >= self._capacity:
                        return  # posting its steps as they complete, or no room
                    head.started = True
                    self._ledger.in_flight += 1
                outcome = self._post(head, None)
            self._after(head, outcome)

    def _advance(self, entry: Entry, statuses=None) -> None:
        """Run the next step of ``entry`` (its previous one is complete): post it, or once its
        last is done, complete it (no lock needed then: nothing is posted)."""
        with self._post_lock if not entry.last_posted else _contextlib.nullcontext():
            outcome = self._post(entry, statuses)
        self._after(entry, outcome)

    def _post(self, entry: Entry, statuses) -> tuple:
        """Run ``entry``'s next step (``_post_lock`` held): ``("posted", how many requests)``,
        ``("done", None)`` or ``("failed", exception)``."""
        try:
            requests, last = entry.next_step(statuses)
        except StopIteration:
            return "done", None
        except BaseException as exc:  # noqa: BLE001 - the operation's failure, whatever it is
            return "failed", exc
        with self._lock:
            entry.outstanding = len(requests)
            if entry.p2p:  # a receive checks what arrived (collectives need no status)
                entry.statuses = [None] * len(requests)
            if last and self._queue and self._queue[0] is entry:
                self._queue.pop(0)
            self._driver.add(entry, requests)
        return "posted", len(requests)

    def _after(self, entry: Entry, outcome: tuple) -> None:
        """Act on a step's outcome, outside the locks (a future's callbacks may run here)."""
        kind, value = outcome
        if kind == "posted":
            if value == 0:  # nothing to wait for: the next step at once
                self._advance(entry, [])
            elif entry.last_posted and not entry.p2p:
                self._pump()
        elif kind == "done":
            self._finish(entry, None)
        else:
            self._failed_step(entry, value)

    def _failed_step(self, entry: Entry, exc: BaseException) -> None:
        if not isinstance(exc, (AgreedError, CountError)):
            # Raised while the step was posting, perhaps after some of its requests: those
            # requests are lost with the step's frame, and MPI may still use their buffers (the
            # frame's locals, held by the exception's traceback). mpisync's own refusals are
            # raised where nothing of the step is posted.
            keep_alive(exc, entry)
        if entry.p2p or entry.last_posted or isinstance(exc, AgreedError):
            with self._lock:
                if self._queue and self._queue[0] is entry:
                    self._queue.pop(0)
            self._finish(entry, exc)
            self._pump()
            return
        kind = "MPI error" if isinstance(exc, MPI.Exception) else type(exc).__name__
        self._break(f"{kind} in {entry.label}: {exc}", entry)

    # -- completing (the driver reports here) -----------------------------------------------------
    def completed(self, entry: Entry, status, error) -> None:
        """One of ``entry``'s requests completed (with ``error``, if MPI reported one)."""
        if error is None:
            if entry.outstanding == 0:
                self._advance(entry, entry.statuses)
            return
        if not entry.p2p:
            self._break(f"MPI error in {entry.label}: {error}", entry)
            return
        with self._lock:  # only this operation failed: the collectives' sequence is intact
            keep_alive(*self._driver.drop(entry))
        truncated = getattr(error, "Get_error_class", lambda: None)() == MPI.ERR_TRUNCATE
        kind = CountError if truncated else OperationError
        rank = getattr(self.comm, "rank", "?")
        self._finish(entry, kind(f"mpisync: rank {rank}: MPI error in {entry.label}: {error}"))

    def _finish(self, entry: Entry, error: BaseException | None) -> None:
        with self._lock:
            finished = self._ledger.remove(entry, error)
            if finished is None:
                return  # finished already (failed with the engine)
            self._cond.notify_all()  # its waiters
        if self._timeline is not None:
            self._timeline.span_since(f"torch {entry.label.split()[0]}", entry.posted, ok=not error)
        future, freed = finished
        if future is not None and self._settler is not None:
            self._settler.submit(entry, future)  # its callbacks may wait: not on this thread
        elif future is not None:
            settle(entry, future)  # no worker: the caller drives, its callbacks run here
        if freed:
            self._pump()  # room for the next collective

    # -- waiting, futures, draining ---------------------------------------------------------------
    def wait(self, entry: Entry, timeout: float | None = None) -> bool:
        """Wait until ``entry`` is done, driving when nobody else does; False if ``timeout``
        seconds passed first."""
        return self._driver.wait(entry, timeout)

    def future(self, entry: Entry):
        """``entry``'s torch future; from now on the worker completes it if nobody waits."""
        with self._lock:
            future = entry.future
            if future is None:
                future = entry.future = torch.futures.Future()
                finished = entry.done
                if not finished:
                    entry.counted = True
                    self._ledger.futures += 1
                    self._driver.call_worker()
            else:
                finished = False  # settled, or to be settled, by whoever finishes it
        if finished:
            settle(entry, future)
        return future

    def drain(self, collectives_only: bool = False) -> None:
        """Wait until every operation submitted so far is done (``collectives_only``: every
        collective; a point-to-point operation may wait for what its peer does later)."""
        with self._lock:
            self._ledger.draining += 1
            self._driver.call_worker()
            pending = [e for e in self._ledger.entries.values() if not (collectives_only and e.p2p)]
        try:
            for entry in pending:
                self.wait(entry)
        finally:
            with self._lock:
                self._ledger.draining -= 1

    # -- deadlines, failures, shutting down -------------------------------------------------------
    def overdue(self) -> None:
        """Report a timeout if the oldest operation's deadline passed, or a rank of the group
        ended its script while operations wait (called by the driver)."""
        with self._lock:
            if self._ledger.broken is not None or not self._ledger.entries:
                return
            if not self._ledger.late() and not departed_in(self.comm):
                return
            labels = self._ledger.labels()
        message = self._on_timeout(labels)  # aborts the job unless MPISYNC_TIMEOUT_ABORT=0
        error = OperationTimeoutError(message, phase="torch.distributed operation", pending=labels)
        self._break(f"an operation timed out ({message})", None, error)

    def _break(
        self, reason: str, culprit: Entry | None, error: BaseException | None = None
    ) -> None:
        """Fail every pending operation; keep whatever MPI may still use alive."""
        with self._lock:
            if self._ledger.broken is None:
                self._ledger.broken = reason
            failed = list(self._ledger.entries.values())
            keep_alive(*failed, *self._driver.abandon())
            self._queue.clear()
            self._cond.notify_all()
        if error is None:
            rank = getattr(self.comm, "rank", "?")
            error = OperationError(
                f"mpisync: rank {rank}: {reason}; this process group is unusable (its "
                "collectives may no longer match the other ranks')"
            )
        for entry in ([culprit] if culprit is not None else []) + failed:
            self._finish(entry, error)

    @property
    def broken(self) -> bool:
        """Whether a timeout, an MPI error or :meth:`abort` made the engine unusable."""
        return self._ledger.broken is not None

    def abort(self, reason: str) -> None:
        """Fail every pending operation now and refuse later ones (MPI cannot cancel them)."""
        self._break(reason, None)

    def halt(self) -> None:
        """The process exits: the worker and the settlers end after what they are doing, without
        waiting for what is in flight (a peer may never post it)."""
        self._driver.halt(_HALT_SECONDS)
        if self._settler is not None:
            self._settler.halt(_HALT_SECONDS)

    def close(self) -> None:
        """Complete what is in flight (within the deadlines), then stop the worker and, once their
        queue is empty, the settlers."""
        if self._ledger.broken is None:
            self.drain()
        with self._lock:
            self._ledger.closing = True
            self._driver.stop()
        if self._ledger.broken is None:
            self._driver.join()
        if self._settler is not None:
            self._settler.close()


@_atexit.register
def _halt_live() -> None:
    # A daemon thread still running Python while the interpreter finalizes is ended inside
    # whatever it runs; inside torch's C++ (a tensor's deallocation releases the GIL) that ends
    # the process with "terminate called without an active exception" (Python 3.11-3.13).
    for engine in list(_LIVE):
        engine.halt()
