"""Completing torch futures off the driver's thread (:class:`Settler`).

``Future.set_result`` runs the future's callbacks on the thread that calls it. A callback may
issue another collective and wait for its future (PowerSGD's hook does, from ``.then()``), and
torch's ``Future.wait`` has no timeout and drives nothing: on the thread that drives MPI, that
wait could never end. So where a worker drives (``MPI_THREAD_MULTIPLE``), futures are settled
by settler threads, oldest first: one is usually enough; whenever every settler is inside a
callback, the next settlement starts another (as many as callbacks wait at once), so a callback
that waits for a later operation's future never waits behind itself. Settlers that stay idle
end, down to one.
"""

from __future__ import annotations

import collections as _collections
import threading as _threading
import time as _time

__all__ = ["Settler"]

# Seconds an idle settler waits for work before it ends (the first one stays).
_IDLE_SECONDS = 5.0


class Settler:
    """Runs ``settle(entry, future)`` calls on settler threads, in the order submitted."""

    def __init__(self, settle):
        self._settle = settle
        self._cond = _threading.Condition()
        self._queue: _collections.deque = _collections.deque()
        self._idle = 0  # settler threads waiting for work
        self._running: set = set()  # the settler threads alive
        self._closing = False  # the group shut down: settlers end once nothing is queued
        self._halted = False  # the process exits: idle settlers end

    def submit(self, entry, future) -> None:
        """Settle ``future`` with ``entry``'s outcome on a settler thread (started if none is
        free)."""
        with self._cond:
            self._queue.append((entry, future))
            if self._idle > len(self._queue) - 1:
                self._cond.notify()
                return
            thread = _threading.Thread(target=self._run, name="mpisync-settler", daemon=True)
            self._running.add(thread)
        thread.start()

    def close(self) -> None:
        """The group shuts down: every settler ends once nothing is queued (a settlement submitted
        later starts one that ends after it)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    def halt(self, seconds: float) -> None:
        """The process exits: settlers end once idle (what is queued stays unsettled); wait at
        most ``seconds`` for them."""
        end = _time.monotonic() + seconds
        with self._cond:
            self._halted = True
            self._cond.notify_all()
            threads = list(self._running)
        for thread in threads:
            if thread is not _threading.current_thread():
                thread.join(max(0.0, end - _time.monotonic()))

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._cond:
                self._running.discard(_threading.current_thread())

    def _serve(self) -> None:
        me = _threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue or self._halted:
                    if (self._halted or self._closing) or (
                        not self._cond.wait(_IDLE_SECONDS)
                        and len(self._running) > 1
                        and not self._queue
                    ):
                        self._idle -= 1
                        self._running.discard(me)
                        return
                self._idle -= 1
                entry, future = self._queue.popleft()
            self._settle(entry, future)  # its callbacks run here; they may wait
