"""The progress engine of the torch backend: nonblocking MPI operations posted in issue order,
completed by whoever needs them first.

The calling thread posts each operation (``Iallreduce``, ``Iallgather``, ...)
on the backend's private communicator the moment torch issues it, so every
rank posts its collectives in the same order (MPI's rule for collectives on
one communicator) and a bucket's reduction starts while the backward pass
goes on. An operation is completed (its requests waited for, its completion
run: copies back, ``avg``'s division, then its torch future) by:

- the caller, when it waits for it (``work.wait()``, every synchronous
  collective): no thread is woken and nothing is handed between threads;
- the progress thread, once anyone asked for the operation's future (DDP's
  buckets and communication hooks do, through ``work.get_future()``), a
  caller waits for room under ``max_concurrent``, or a drain waits. It
  completes what is pending oldest first, waiting inside MPI (the GIL is
  released there), and sleeps once nothing is pending;
- the progress thread too for an operation nobody asked about: the sweep
  (every second, or a quarter of the timeout) hands it over once it has been
  pending that long, so its buffers go and its timeout cannot fire falsely.

That needs ``MPI_THREAD_MULTIPLE`` (mpi4py's default); at a lower thread
level every operation completes on the calling thread before the call
returns (see :attr:`Engine.threaded`).

The sweep's thread enforces the timeout: an operation in flight for longer is
reported (which operations, on which rank) and the job aborts, as for
``sync_params`` (``MPISYNC_TIMEOUT_ABORT=0``: it and every later one fail
with :class:`~mpisync.SyncTimeoutError` instead). Below
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
import typing as _typing

import torch
from mpi4py import MPI

from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired, wait_request
from ..config import abort_on_timeout as _abort_on_timeout
from ..errors import SyncError, SyncTimeoutError

__all__ = ["Engine", "Operation"]

# The sweep's period without a timeout (with one: a quarter of it, at most this).
_SWEEP_SECONDS = 1.0


_PENDING, _RETIRING, _FINISHED = "pending", "retiring", "finished"
# How often a thread waiting to claim an operation checks whether it finished meanwhile (failed
# with the engine while its claimer is still inside MPI).
_CLAIM_POLL_SECONDS = 0.05


class Operation:
    """One posted operation: its requests, what runs once they complete, its outcome and its
    future."""

    __slots__ = (
        "requests",
        "finish",
        "result",
        "label",
        "future",
        "error",
        "posted",
        "claim",
        "state",
        "buffers",
    )

    requests: _typing.Sequence  # empty until posted

    def __init__(self, finish, result, label):
        self.requests, self.finish, self.result, self.label = (), finish, result, label
        # made when first asked for (Engine.future): a synchronous call never needs one
        self.future = None
        self.error = None  # what the operation failed with, once finished
        # What the requests read and write (the poster's closure holds the host copies): MPI may use
        # a buffer until its request completes, and mpi4py's requests need not keep it alive.
        self.buffers = None
        self.posted = _time.monotonic()
        # Whoever holds ``claim`` waits for or tests the requests (MPI forbids two threads waiting
        # on
        # one request), and releases it when done with them.
        self.claim = _threading.Lock()
        self.state = _PENDING  # changed under the engine's lock only

    def finished(self) -> bool:
        """Whether the operation completed (or failed)."""
        return self.state is _FINISHED

    def take(self) -> bool:
        """Claim the requests (True), or wait until the operation finished (False). A claimer
        releases the claim once it completed the operation, or when a test found it pending."""
        while True:
            if self.claim.acquire(timeout=_CLAIM_POLL_SECONDS):
                if self.finished():
                    self.claim.release()
                    return False
                return True
            if self.finished():  # failed with the engine while its claimer is still in MPI
                return False

    def raise_error(self) -> None:
        """Raise what the (finished) operation failed with, if anything."""
        if self.error is not None:
            raise self.error


def _settle(operation, future) -> None:
    """Complete ``future`` with the finished ``operation``'s outcome (runs its callbacks here)."""
    if operation.error is not None:
        future.set_exception(operation.error)
    else:
        future.set_result(operation.result)


class _Failures:
    """How the engine breaks: the sweep's thread (stale operations handed over, the timeout
    enforced), a timeout's report, an MPI error; failed operations are kept alive."""

    # Engine's: set by its __init__ (and its _hurry method)
    comm: MPI.Intracomm
    _timeout: float | None
    _on_timeout: _typing.Callable[[list], str]
    _pending: _collections.deque
    _cond: _threading.Condition
    _broken: str | None
    _closing: bool
    _hurry: _typing.Callable[[], None]

    def _watch(self) -> None:
        period = _SWEEP_SECONDS if self._timeout is None else min(_SWEEP_SECONDS, self._timeout / 4)
        while True:
            _time.sleep(period)
            with self._cond:
                if (self._closing and not self._pending) or self._broken is not None:
                    return
                if not self._pending:
                    continue
                age = _time.monotonic() - self._pending[0].posted
                # nobody asked for it, or nobody could: the progress thread takes it
                if age >= period:
                    self._hurry()
                if self._timeout is None or age < self._timeout:
                    continue
            self._expire()
            return

    def _expire(self, extra=()) -> None:
        """Report the operations in flight (once): abort, or fail every pending one (and
        ``extra``)."""
        with self._cond:
            if self._broken is not None:
                return
            self._broken = "an operation timed out; its collectives may still be pending"
            failed = list(extra) + list(self._pending)
            self._cond.notify_all()
        # aborts the job, unless MPISYNC_TIMEOUT_ABORT=0
        error = self._on_timeout([op.label for op in failed])
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
        self._abandon(
            failed,
            SyncError(
                f"mpisync: rank {self.comm.rank}: {reason}; this process group is "
                "unusable (its collectives may no longer match the other ranks')"
            ),
        )

    def _abandon(self, failed: list, error: BaseException) -> None:
        # Requests that may still be in flight keep their buffers alive (MPI may write into them).
        keep_alive(*failed)
        futures = []
        with self._cond:
            for operation in failed:
                if operation.state is not _PENDING:  # completed, or completing
                    continue
                operation.error = error
                operation.state = _FINISHED
                if operation.future is not None:
                    futures.append(operation)
            self._cond.notify_all()
        for operation in futures:
            _settle(operation, operation.future)


class Engine(_Failures):
    """Nonblocking operations on ``comm``: at most ``capacity`` in flight, each within ``timeout``
    seconds."""

    def __init__(self, comm, capacity: int, timeout: float | None, on_timeout):
        self.comm = comm
        self._capacity = capacity
        self._timeout = timeout
        # (label list) -> message: reports, then aborts or returns the message
        self._on_timeout = on_timeout
        self._pending: _collections.deque = _collections.deque()
        self._cond = _threading.Condition()
        # one poster at a time: the posting order is the issue order
        self._post_lock = _threading.Lock()
        self._broken = None
        self._closing = False
        # The progress thread completes what is pending only while _urgent (a future was asked for,
        # a
        # caller waits for room or a drain, or the sweep found an operation nobody asked about), and
        # is woken only when it sleeps: a synchronous call wakes no thread.
        self._urgent = False
        self._asleep = False
        self._waiters = 0
        self._abort = _abort_on_timeout()
        self.threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._thread = None
        if self.threaded:
            self._thread = _threading.Thread(
                target=self._progress, name="mpisync-progress", daemon=True
            )
            self._thread.start()
            _threading.Thread(target=self._watch, name="mpisync-watchdog", daemon=True).start()

    def submit(self, post, finish=None, result=None, label: str = "") -> Operation:
        """Post ``post(comm)`` (an iterable of requests) now; once they complete, run ``finish()``
        and
        complete the operation (and its future, if asked for) with ``result``."""
        operation = Operation(finish, result, label)
        if not self.threaded:  # no progress thread may call MPI: complete here, now
            with operation.claim:
                with self._post_lock:
                    self._check()
                    operation.buffers = post
                    operation.requests = self._post(post, operation)
                # outside _post_lock: a callback of its future may submit
                self._wait_here(operation)
            return operation
        if len(self._pending) >= self._capacity and _threading.current_thread() is not self._thread:
            # The progress thread never waits for room (a callback of a future it completes may
            # submit): only it frees room. Nor does a caller waiting for room hold _post_lock.
            with self._cond:
                while len(self._pending) >= self._capacity and self._broken is None:
                    self._waiters += 1
                    self._hurry()
                    self._cond.wait()
                    self._waiters -= 1
        with self._post_lock:
            self._check()
            operation.buffers = post
            operation.requests = self._post(post, operation)
            with self._cond:
                self._pending.append(operation)
        return operation

    def _hurry(self) -> None:
        """Have the progress thread complete what is pending (call with ``_cond`` held)."""
        self._urgent = True
        if self._asleep:
            self._cond.notify_all()

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
            operation.raise_error()  # the SyncError _fail set
        return requests

    def _wait_here(self, operation) -> None:
        """Below MPI_THREAD_MULTIPLE: wait for ``operation`` within the deadline, then complete
        it."""
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
        self._retire(operation)

    def wait(self, operation: Operation) -> None:
        """Wait for ``operation``: complete it on this thread unless another thread is completing it
        (then wait for that). Its error, if any, is left in ``operation.error``."""
        if not operation.take():
            return
        try:
            # the watchdog aborts the job if it never completes
            if self._timeout is None or self._abort:
                MPI.Request.Waitall(operation.requests)
            else:  # polled, so that the caller itself can report the timeout and raise
                deadline = operation.posted + self._timeout
                for request in operation.requests:
                    wait_request(request, deadline)
        except Expired:
            self._expire()  # operation.error holds the timeout error set by _expire
        except MPI.Exception as exc:
            self._fail(operation, exc)
        else:
            self._retire(operation)
        finally:
            operation.claim.release()

    def test(self, operation: Operation) -> bool:
        """Whether ``operation`` finished; completes it here if its requests have
        (``is_completed``)."""
        if operation.finished():
            return True
        if not operation.claim.acquire(blocking=False):
            return False  # another thread is waiting for it
        try:
            if not operation.finished() and MPI.Request.Testall(operation.requests):
                self._retire(operation)
        except MPI.Exception as exc:
            self._fail(operation, exc)
        finally:
            operation.claim.release()
        return operation.finished()

    def future(self, operation: Operation):
        """The torch future of ``operation`` (made on the first request); from then on the progress
        thread completes what is pending, so the future completes without anyone waiting."""
        settle = False
        with self._cond:
            future = operation.future
            if future is None:
                future = operation.future = torch.futures.Future()
                settle = operation.finished()  # else whoever finishes it completes the future
            if operation.state is _PENDING:
                self._hurry()
        if settle:
            _settle(operation, future)
        return future

    @property
    def broken(self) -> bool:
        """Whether a timeout or an MPI error made the engine unusable (requests may still be in
        flight)."""
        return self._broken is not None

    def drain(self) -> None:
        """Wait until every operation posted so far has completed."""
        with self._cond:
            while self._pending and self._broken is None:
                self._waiters += 1
                self._hurry()
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

    def _retire(self, operation) -> None:
        """Run the completion of ``operation`` (its requests are done, its claim held), then finish
        it."""
        with self._cond:
            # failed meanwhile with the engine (a timeout elsewhere)
            if operation.state is not _PENDING:
                return
            # from here on it completes: a failure elsewhere leaves it be
            operation.state = _RETIRING
        error = None
        try:
            if operation.finish is not None:
                operation.finish()
        except BaseException as exc:  # a failed copy-back fails the operation, not the thread
            error = exc
        with self._cond:
            operation.error = error
            try:
                self._pending.remove(operation)
            except ValueError:  # completed at submit, below MPI_THREAD_MULTIPLE
                pass
            operation.buffers = None  # done with: the host copies may go
            operation.state = _FINISHED
            future = operation.future
            if self._waiters:
                self._cond.notify_all()
        if future is not None:
            _settle(operation, future)

    def _next(self):
        """The oldest pending operation once there is work for the progress thread; None: stop."""
        cond, pending = self._cond, self._pending
        with cond:
            while True:
                if self._broken is not None:
                    return None
                if pending and (self._urgent or self._closing):
                    return pending[0]
                if not pending:
                    self._urgent = False
                    if self._closing:
                        return None
                self._asleep = True
                cond.wait()
                self._asleep = False

    def _progress(self) -> None:
        while True:
            operation = self._next()
            if operation is None:
                return
            if not operation.take():  # a caller completed it
                continue
            try:
                MPI.Request.Waitall(operation.requests)  # in MPI, without the GIL
            except MPI.Exception as exc:
                self._fail(operation, exc)
                return
            else:
                self._retire(operation)
            finally:
                operation.claim.release()
