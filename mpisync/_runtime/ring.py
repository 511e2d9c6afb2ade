"""A ring of nonblocking MPI requests that caps how many are in flight.

This is Caffe2's ``CollectivesConcurrencyControl`` with MPI requests in place
of common worlds: operation k waits for operation k - capacity.
"""

from __future__ import annotations

import collections as _collections
import collections.abc as _abc
import os as _os
import time as _time
import typing as _typing

from . import failfast as _failfast
from .keepalive import keep_alive
from .spin import SLEEP_SECONDS, SPIN_SECONDS

__all__ = ["RequestRing", "Expired", "wait_request"]

# Python-level polling keeps the timeout enforceable; how it spins, then sleeps: .spin.

# Called once per poll of a request still in flight, where set: tests replace it to raise at a
# chosen poll (an interrupt landing while MPI still owns the request's buffers).
_poll_hook: _typing.Callable[[], None] | None = None


class Expired(Exception):
    """A request's deadline passed before it completed."""

    #: The names the timed-out wait was for, where the waiter knows them (else ``None``).
    pending: list[str] | None = None


def wait_request(request, deadline: float | None, comm=None) -> None:
    """Wait for ``request``; raise :class:`Expired` once ``time.monotonic()`` passes ``deadline``,
    or once a rank of ``comm`` (the request's communicator, where the caller knows it) has ended
    its script (:func:`mpisync._runtime.failfast.departed_in`).

    ``deadline=None`` with nothing to watch waits inside MPI (``Wait``).
    """
    if deadline is None and (comm is None or not _failfast.watching()):
        request.Wait()
        return
    if request.Test():
        return
    try:
        _poll(request, deadline, comm)
    except BaseException:
        # A timeout, or anything else leaving the wait (an interrupt, SystemExit): MPI may still
        # write into the request's buffers, which mpi4py holds for it; freeing the request would
        # hand them back to the allocator.
        keep_alive(request)
        raise


def _poll(request, deadline: float | None, comm) -> None:
    lookout = _failfast.Lookout(comm)
    stall_start = _time.monotonic()
    test, now, yield_ = request.Test, _time.monotonic, _os.sched_yield
    while not test():
        if _poll_hook is not None:
            _poll_hook()
        t = now()
        if (deadline is not None and t >= deadline) or lookout.gone(t):
            raise Expired
        if t - stall_start < SPIN_SECONDS:
            yield_()
        else:
            _time.sleep(SLEEP_SECONDS)


class RequestRing:
    """At most ``capacity`` MPI requests in flight; :meth:`push` waits for the oldest when full.

    Caffe2's ``CollectivesConcurrencyControl`` with MPI requests: operation ``k``
    waits for operation ``k - capacity``. Requests are any objects with
    mpi4py's ``Wait()`` (``comm.Ibcast(...)``, ``comm.Iallreduce(...)``, ...).
    ``len(ring)`` is the number in flight.

    Args:
        capacity: The most requests in flight at once (an int >= 1).

    Raises:
        ValueError: ``capacity`` is not an int >= 1.

    Example::

        ring = mpisync.RequestRing(4)
        for buf in buffers:
            ring.push(comm.Ibcast(buf, root=0))
        ring.drain()
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._pending: _collections.deque = _collections.deque()
        #: Requests retired so far: request ``k`` (from 0, in push order) is done once this is
        #: greater than ``k``.
        self.retired = 0

    @property
    def capacity(self) -> int:
        """The most requests in flight at once."""
        return self._capacity

    def __len__(self) -> int:
        return len(self._pending)

    def push(self, request: _typing.Any) -> None:
        """Add ``request``, first waiting for the oldest one if ``capacity`` are in flight.

        Args:
            request: A started nonblocking MPI request (anything with ``Wait()``).

        Raises:
            mpi4py.MPI.Exception: Waiting for an older request failed in MPI (the ring keeps the
                request that failed).
        """
        self.make_room()
        self._pending.append(request)

    def make_room(self) -> None:
        """Wait for the oldest requests until fewer than ``capacity`` are in flight.

        Raises:
            mpi4py.MPI.Exception: Waiting for a request failed in MPI.
        """
        while len(self._pending) >= self._capacity:
            self._retire_oldest()

    def drain(self) -> None:
        """Wait for every request in flight, oldest first.

        Raises:
            mpi4py.MPI.Exception: Waiting for a request failed in MPI (the requests after it stay
                in the ring).
        """
        while self._pending:
            self._retire_oldest()

    def retire_through(self, k: int) -> None:
        """Wait, oldest first, until the ``k``-th request pushed (from 0) is retired.

        Args:
            k: The push index (from 0) of the request to wait for.

        Raises:
            mpi4py.MPI.Exception: Waiting for a request failed in MPI.
        """
        while self.retired <= k and self._pending:
            self._retire_oldest()

    def _retire_oldest(self) -> None:
        self._pending[0].Wait()
        self._pending.popleft()
        self.retired += 1


class TrackedRing(RequestRing):
    """The ring mpisync uses: each request has a deadline, a label and a completion callback.

    Callbacks run oldest first, so a parameter split into several requests is
    complete when the callback of its last request runs.
    """

    def __init__(self, capacity: int, timeout: float | None, comm=None):
        super().__init__(capacity)
        self._timeout = timeout
        self._comm = comm  # the requests' communicator: a rank of it that left ends the wait

    def push(self, request, on_complete=None, label: _abc.Sequence[str] = "") -> None:
        """Add ``request``; ``on_complete()`` runs when it is retired."""
        self.make_room()
        deadline = None if self._timeout is None else _time.monotonic() + self._timeout
        self._pending.append((request, deadline, on_complete, label))

    def pending_labels(self) -> list:
        """Labels of the requests in flight, oldest first."""
        return [entry[3] for entry in self._pending]

    def _retire_oldest(self) -> None:
        request, deadline, on_complete, _ = self._pending[0]
        try:
            wait_request(request, deadline, self._comm)
        except BaseException:
            # every one in flight may still write, whatever ended the wait
            keep_alive(*(entry[0] for entry in self._pending))
            raise
        self._pending.popleft()
        self.retired += 1
        if on_complete is not None:
            on_complete()
