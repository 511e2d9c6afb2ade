"""The engine's unfinished operations, and what they ask of the driver (:class:`Ledger`).

Every field is guarded by the engine's lock: call every method with it held.
"""

from __future__ import annotations

import time as _time

from .entry import Entry
from .errors import OperationError

__all__ = ["Ledger"]

# How old an operation nobody waits for gets before the worker completes it.
SWEEP_SECONDS = 0.1


class Ledger:
    """Unfinished operations in submission order, the collectives among them in flight, and the
    engine's condition (broken, shutting down). With a ``timeout`` the worker looks at least
    every quarter of it."""

    def __init__(self, timeout: float | None):
        self.entries: dict = {}  # id(entry) -> entry, oldest first
        self.in_flight = 0  # collectives started and not finished
        self.futures = 0  # unfinished entries whose future was asked for
        self.draining = 0  # callers waiting for every operation so far
        self.broken: str | None = None
        self.closing = False
        self.sweep = SWEEP_SECONDS if timeout is None else min(SWEEP_SECONDS, timeout / 4)

    def check(self) -> None:
        """Raise unless new operations are welcome."""
        if self.broken is not None:
            raise OperationError(f"mpisync: this process group is unusable: {self.broken}")
        if self.closing:
            raise OperationError("mpisync: this process group is shut down")

    def add(self, entry: Entry) -> None:
        """Count in a submitted operation."""
        self.entries[id(entry)] = entry

    def remove(self, entry: Entry, error: BaseException | None) -> tuple | None:
        """Record ``entry`` as finished with ``error``: ``(future, freed)`` (its future, if one was
        asked for; whether a collective's place under the cap came free), or None when it had
        finished already (failed with the engine)."""
        if self.entries.pop(id(entry), None) is None:
            return None
        freed = entry.started and not entry.p2p
        if freed:
            self.in_flight -= 1
        if entry.counted:
            self.futures -= 1
        entry.error, entry.done = error, True
        if error is None:
            entry.steps = None  # done with: the buffers its frame held may go
        return entry.future, freed

    def oldest(self) -> Entry | None:
        """The oldest unfinished operation."""
        return next(iter(self.entries.values()), None)

    def labels(self) -> list:
        """The labels of every unfinished operation, oldest first."""
        return [e.label for e in self.entries.values()]

    def late(self) -> bool:
        """Whether the oldest operation's deadline passed."""
        oldest = self.oldest()
        return (
            oldest is not None
            and oldest.deadline is not None
            and _time.monotonic() >= oldest.deadline
        )

    def due(self) -> bool:
        """Whether the worker should drive: something is pending that a future, a drain or a
        shutdown waits for, or that nobody has waited for a while."""
        oldest = self.oldest()
        if oldest is None or self.broken is not None:
            return False
        if self.futures or self.draining or self.closing:
            return True
        return _time.monotonic() >= oldest.posted + self.sweep or self.late()

    def pause(self) -> float:
        """How long the idle worker sleeps before it looks again."""
        oldest = self.oldest()
        if oldest is None:
            return self.sweep
        until = oldest.posted + self.sweep
        if oldest.deadline is not None:
            until = min(until, oldest.deadline)
        return max(0.001, until - _time.monotonic())

    def over(self) -> bool:
        """Whether the worker's job is over: nothing left, and nothing more to come."""
        return not self.entries and (self.closing or self.broken is not None)
