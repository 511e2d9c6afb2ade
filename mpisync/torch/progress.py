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
fail with :class:`~mpisync.SyncTimeoutError` instead). Below
``MPI_THREAD_MULTIPLE`` the caller polls its operation against the same
deadline, with the same outcome.

An MPI error (a message truncated because ranks passed different sizes, a
failed receive, ...) breaks the engine: the failing operation and every
pending one fail with a :class:`~mpisync.SyncError` naming the MPI error, and
every later operation raises at once.

Futures completed on the progress thread run their ``then`` callbacks there.
A callback may issue further operations (as communication hooks do): those
never wait for room (only the progress thread frees room), and, as with any
backend, every rank must issue them in the same order relative to its other
collectives.
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
# (see docs/allreduce.md). Asynchronous operations start completing this much later; their
# transfer is already posted.
_CALLER_HEAD_START = 0.0005
# An idle progress thread looks for new operations this often, and sleeps until woken after this
# long without any.
_IDLE_POLL_SECONDS = 0.0005
_IDLE_SLEEP_AFTER = 0.2
# Failed operations (requests and buffers): never freed, since MPI may still complete them.
_ABANDONED: list = []


class Operation:
    """One posted operation: its requests, what runs once they complete, and its future."""

    __slots__ = ("requests", "finish", "result", "label", "future", "posted", "claim", "done", "buffers")

    def __init__(self, requests, finish, result, label, future):
        self.requests, self.finish, self.result, self.label, self.future = requests, finish, result, label, future
        # What the requests read and write (the poster's closure holds the host copies): MPI may use
        # a buffer until its request completes, and mpi4py's requests need not keep it alive.
        self.buffers = None
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
        # Waking a thread is not free: submit wakes the progress thread only when it sleeps untimed
        # (idle for a while; otherwise it polls every _IDLE_POLL_SECONDS), and a retirement wakes
        # only threads waiting for room or for a drain.
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
        """Post ``post(comm)`` (an iterable of requests) now; once they complete, run ``finish()`` and
        complete the operation's future with ``result``."""
        future = torch.futures.Future()
        if not self.threaded:  # no progress thread may call MPI: complete here, now
            with self._post_lock:
                self._check()
                operation = Operation((), finish, result, label, future)
                operation.claim.acquire()  # completed here: nobody waits for its requests again
                operation.buffers = post
                operation.requests = self._post(post, operation)
            self._wait_here(operation)  # outside _post_lock: a callback of its future may submit
            return operation
        if _threading.current_thread() is not self._thread:
            # The progress thread never waits for room (a callback of a future it completes may
            # submit): only it frees room. Nor does a caller waiting for room hold _post_lock.
            with self._cond:
                while len(self._pending) >= self._capacity and self._broken is None:
                    self._waiters += 1
                    self._cond.wait()
                    self._waiters -= 1
        with self._post_lock:
            self._check()
            operation = Operation((), finish, result, label, future)
            operation.buffers = post
            operation.requests = self._post(post, operation)
            with self._cond:
                self._pending.append(operation)
                if self._asleep:
                    self._cond.notify_all()
        return operation

    def _post(self, post, operation) -> list:
        """The requests ``post`` posts; if it fails after posting some, they stay alive and the
        engine breaks (this rank's collectives no longer match the other ranks')."""
        requests: list = []
        try:
            for request in post(self.comm):
                requests.append(request)
        except BaseException as exc:
            if not requests:
                raise
            operation.requests = requests
            self._fail(operation, exc)
            operation.future.wait()  # raises the SyncError _fail set
        return requests

    def _wait_here(self, operation) -> None:
        """Below MPI_THREAD_MULTIPLE: wait for ``operation`` within the deadline, then complete it."""
        deadline = None if self._timeout is None else operation.posted + self._timeout
        try:
            for request in operation.requests:
                wait_request(request, deadline)
        except Expired:
            self._expire(extra=[operation])
            return
        except MPI.Exception as exc:
            self._fail(operation, exc)
            return
        self._complete(operation)

    def wait(self, operation: Operation) -> None:
        """Wait for ``operation``: complete it on this thread if the progress thread has not started
        on it (a synchronous call then costs no hand-over between threads), else wait for it."""
        if not operation.claim.acquire(blocking=False):
            operation.wait_finished()
            return
        try:
            if self._timeout is None or self._abort:  # the watchdog aborts the job if it never completes
                MPI.Request.Waitall(operation.requests)
            else:  # polled, so that the caller itself can report the timeout and raise
                deadline = operation.posted + self._timeout
                for request in operation.requests:
                    wait_request(request, deadline)
        except Expired:
            self._expire()
            return  # the future holds the timeout error set by _expire
        except MPI.Exception as exc:
            self._fail(operation, exc)
            return
        self._retire(operation)

    @property
    def broken(self) -> bool:
        """Whether a timeout or an MPI error made the engine unusable (requests may still be in flight)."""
        return self._broken is not None

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
        operation.buffers = None  # done with: the host copies may go
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
                try:
                    MPI.Request.Waitall(operation.requests)  # in MPI, without the GIL
                except MPI.Exception as exc:
                    self._fail(operation, exc)
                    return
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

    def _expire(self, extra=()) -> None:
        """Report the operations in flight (once): abort, or fail every pending future (and ``extra``)."""
        with self._cond:
            if self._broken is not None:
                return
            self._broken = "an operation timed out; its collectives may still be pending"
            failed = list(extra) + list(self._pending)
            self._cond.notify_all()
        error = self._on_timeout([op.label for op in failed])  # aborts the job, unless MPISYNC_TIMEOUT_ABORT=0
        self._broken = f"an operation timed out ({error}); its collectives may still be pending"
        self._abandon(failed, SyncTimeoutError(error))

    def _fail(self, operation, exc: BaseException) -> None:
        """An MPI error in ``operation`` (or an error posting it after some of its requests were
        posted): break the engine, fail it and every pending operation."""
        kind = "MPI error" if isinstance(exc, MPI.Exception) else type(exc).__name__
        reason = f"{kind} in {operation.label or 'an operation'}: {exc}"
        with self._cond:
            if self._broken is None:
                self._broken = reason
            failed = [operation] + [op for op in self._pending if op is not operation]
            self._cond.notify_all()
        self._abandon(failed, SyncError(f"mpisync: rank {self.comm.rank}: {reason}; this process group is "
                                        "unusable (its collectives may no longer match the other ranks')"))

    @staticmethod
    def _abandon(failed: list, error: BaseException) -> None:
        # Requests that may still be in flight keep their buffers alive (MPI may write into them).
        _ABANDONED.extend(failed)
        for operation in failed:
            if not operation.future.done():
                operation.future.set_exception(error)
            operation.mark_finished()
