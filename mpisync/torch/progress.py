"""The progress engine of the torch backend: nonblocking MPI operations posted in issue order,
completed oldest first by one progress thread.

The calling thread posts each operation (``Iallreduce``, ``Iallgather``, ...)
on the backend's private communicator the moment torch issues it, so every
rank posts its collectives in the same order (MPI's rule for collectives on
one communicator) and a bucket's reduction starts while the backward pass
goes on. The progress thread waits for the oldest operation inside MPI (the
GIL is released there), runs its completion (copies back, ``avg``'s
division) and completes its torch future. That needs ``MPI_THREAD_MULTIPLE``
(mpi4py's default); at a lower thread level every operation completes on the
calling thread before the call returns (see :attr:`Engine.threaded`).

A watchdog enforces the timeout: an operation in flight for longer is
reported (which operations, on which rank) and the job aborts, as for
``sync_params`` (``MPISYNC_TIMEOUT_ABORT=0``: its future and every later one
fail with :class:`~mpisync.SyncTimeoutError` instead).
"""

from __future__ import annotations

import collections as _collections
import threading as _threading
import time as _time

import torch
from mpi4py import MPI

from ..config import abort_on_timeout as _abort_on_timeout
from ..errors import SyncError, SyncTimeoutError
from ..ring import Expired, wait_request

__all__ = ["Engine", "Operation"]

# Seconds the progress thread leaves a fresh operation to its caller: a synchronous call waits for
# its operation at once and completes it on its own thread, without a hand-over between threads
# (which cost hundreds of microseconds on a loaded machine). Asynchronous operations start
# completing this much later; their transfer is already posted.
_CALLER_HEAD_START = 0.0005
# An idle progress thread looks for new operations this often, and sleeps until woken after this
# long without any.
_IDLE_POLL_SECONDS = 0.0005
_IDLE_SLEEP_AFTER = 0.2


class Operation:
    """One posted operation: its requests, what runs once they complete, and its future."""

    __slots__ = ("requests", "finish", "result", "label", "future", "posted", "claim", "done")

    def __init__(self, requests, finish, result, label, future):
        self.requests, self.finish, self.result, self.label, self.future = requests, finish, result, label, future
        self.posted = _time.monotonic()
        # Whoever takes ``claim`` waits for the requests (MPI forbids two threads waiting on one
        # request): the progress thread, or a caller that waits before the thread got to it.
        self.claim = _threading.Lock()
        self.done = _threading.Lock()  # held until the operation completes (a lighter Event)
        self.done.acquire()

    def finished(self) -> bool:
        """Whether the operation completed (or failed)."""
        return not self.done.locked()

    def wait_finished(self) -> None:
        """Block until the operation completed (or failed)."""
        with self.done:
            pass

    def mark_finished(self) -> None:
        """Release whoever waits in :meth:`wait_finished` (once)."""
        if self.done.locked():
            self.done.release()


class Engine:
    """Nonblocking operations on ``comm``: at most ``capacity`` in flight, each within ``timeout`` seconds."""

    def __init__(self, comm, capacity: int, timeout: float | None, on_timeout):
        self.comm = comm
        self._capacity = capacity
        self._timeout = timeout
        self._on_timeout = on_timeout  # (label list) -> None: reports, then aborts or returns
        self._pending: _collections.deque = _collections.deque()
        self._cond = _threading.Condition()
        self._post_lock = _threading.Lock()  # one poster at a time: the posting order is the issue order
        self._broken = None
        self._closing = False
        # Waking a thread costs tens of microseconds: submit wakes the progress thread only when it
        # sleeps untimed (idle for a while; otherwise it polls every _IDLE_POLL_SECONDS), and a
        # retirement wakes only threads waiting for room or for a drain.
        self._asleep = False
        self._waiters = 0
        self._abort = _abort_on_timeout()
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._thread = None
        if self.threaded:
            self._thread = _threading.Thread(target=self._progress, name="mpisync-progress", daemon=True)
            self._thread.start()
            if timeout is not None:
                _threading.Thread(target=self._watch, name="mpisync-watchdog", daemon=True).start()

    def submit(self, post, finish=None, result=None, label: str = "") -> Operation:
        """Post ``post(comm) -> [requests]`` now; once they complete, run ``finish()`` and complete the
        operation's future with ``result``."""
        future = torch.futures.Future()
        with self._post_lock:
            self._check()
            if not self.threaded:  # no progress thread may call MPI: complete here, now
                operation = Operation((), finish, result, label, future)
                operation.claim.acquire()  # completed here: nobody waits for its requests again
                MPI.Request.Waitall(post(self.comm))
                self._complete(operation)
                return operation
            with self._cond:
                while len(self._pending) >= self._capacity and self._broken is None:
                    self._waiters += 1
                    self._cond.wait()
                    self._waiters -= 1
                self._check()
                operation = Operation(post(self.comm), finish, result, label, future)
                self._pending.append(operation)
                if self._asleep:
                    self._cond.notify_all()
        return operation

    def wait(self, operation: Operation) -> None:
        """Wait for ``operation``: complete it on this thread if the progress thread has not started
        on it (a synchronous call then costs no hand-over between threads), else wait for it."""
        if not operation.claim.acquire(blocking=False):
            operation.wait_finished()
            return
        if self._timeout is None or self._abort:  # the watchdog aborts the job if it never completes
            MPI.Request.Waitall(operation.requests)
        else:  # polled, so that the caller itself can report the timeout and raise
            deadline = operation.posted + self._timeout
            try:
                for request in operation.requests:
                    wait_request(request, deadline)
            except Expired:
                self._expire()
                operation.future.wait()  # raises the timeout error set by _expire
        self._retire(operation)

    def drain(self) -> None:
        """Wait until every operation posted so far has completed."""
        with self._cond:
            while self._pending and self._broken is None:
                self._waiters += 1
                self._cond.wait()
                self._waiters -= 1
        self._check()

    def close(self) -> None:
        """Complete what is in flight, then stop the progress thread."""
        if self._broken is None:
            self.drain()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None and self._broken is None:
            self._thread.join()

    def _check(self) -> None:
        if self._broken is not None:
            raise SyncError(f"mpisync: this process group is unusable: {self._broken}")
        if self._closing:
            raise SyncError("mpisync: this process group is shut down")

    @staticmethod
    def _complete(operation) -> None:
        try:
            if operation.finish is not None:
                operation.finish()
        except BaseException as exc:  # a failed copy-back fails the operation, not the thread
            operation.future.set_exception(exc)
        else:
            operation.future.set_result(operation.result)
        operation.mark_finished()

    def _retire(self, operation) -> None:
        with self._cond:
            if self._broken is not None:  # the watchdog already failed this future
                return
            self._pending.remove(operation)
            if self._waiters:
                self._cond.notify_all()
        self._complete(operation)

    def _progress(self) -> None:
        cond, pending = self._cond, self._pending
        active = _time.monotonic()
        while True:
            with cond:
                if not pending and not self._closing:
                    if _time.monotonic() - active < _IDLE_SLEEP_AFTER:
                        cond.wait(_IDLE_POLL_SECONDS)
                    else:
                        self._asleep = True
                        cond.wait()
                        self._asleep = False
                    continue
                if not pending:
                    return
                active = _time.monotonic()
                if self._broken is not None:
                    return
                operation = pending[0]
                head_start = operation.posted + _CALLER_HEAD_START - _time.monotonic()
                if head_start > 0 and not operation.claim.locked():
                    cond.wait(head_start)
                    continue
            if operation.claim.acquire(blocking=False):
                MPI.Request.Waitall(operation.requests)  # in MPI, without the GIL
                self._retire(operation)
            else:  # a caller is completing it
                operation.wait_finished()

    def _watch(self) -> None:
        period = min(1.0, self._timeout / 4)
        while True:
            _time.sleep(period)
            with self._cond:
                if self._closing and not self._pending:
                    return
                if self._broken is not None:
                    return
                if not self._pending or _time.monotonic() - self._pending[0].posted < self._timeout:
                    continue
            self._expire()
            return

    def _expire(self) -> None:
        """Report the operations in flight (once): abort, or fail every pending future."""
        with self._cond:
            if self._broken is not None:
                return
            self._broken = "an operation timed out; its collectives may still be pending"
            failed = list(self._pending)
            self._cond.notify_all()
        error = self._on_timeout([op.label for op in failed])  # aborts the job, unless MPISYNC_TIMEOUT_ABORT=0
        self._broken = f"an operation timed out ({error}); its collectives may still be pending"
        for operation in failed:
            if not operation.future.done():
                operation.future.set_exception(SyncTimeoutError(error))
            operation.mark_finished()
