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
        self._threads = 0

    def submit(self, entry, future) -> None:
        """Settle ``future`` with ``entry``'s outcome on a settler thread (started if none is
        free)."""
        with self._cond:
            self._queue.append((entry, future))
            if self._idle > len(self._queue) - 1:
                self._cond.notify()
                return
            self._threads += 1
        _threading.Thread(target=self._run, name="mpisync-settler", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._queue:
                    if not self._cond.wait(_IDLE_SECONDS) and self._threads > 1:
                        if not self._queue:
                            self._idle -= 1
                            self._threads -= 1
                            return
                self._idle -= 1
                entry, future = self._queue.popleft()
            self._settle(entry, future)  # its callbacks run here; they may wait
