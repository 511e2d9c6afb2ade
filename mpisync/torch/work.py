"""torch's work object for one operation of the engine."""

from __future__ import annotations

import datetime as _datetime

import torch.distributed as dist

from .errors import WaitTimeoutError

__all__ = ["Work", "joint", "seconds"]


def seconds(timeout) -> float | None:
    """``timeout`` (a timedelta, seconds, or None) in seconds; zero or None: no limit (torch's
    ``kNoTimeout`` reaches Python as ``timedelta(0)``)."""
    if timeout is None:
        return None
    value = timeout.total_seconds() if isinstance(timeout, _datetime.timedelta) else float(timeout)
    return value if value > 0 else None


class Work(dist._Work):
    """One operation as torch sees it: ``wait(timeout)``, ``is_completed()``, ``get_future()``,
    ``result()``, ``exception()``, and the sender's rank of a receive from any source."""

    def __init__(self, engine, entry, rank: int, source: list | None = None):
        super().__init__()
        self._engine, self._entry, self._rank, self._source = engine, entry, rank, source

    def wait(self, timeout=None) -> bool:
        """Wait for the operation (at most ``timeout``); raise what it failed with. A wait that
        times out raises :class:`~mpisync.torch.errors.WaitTimeoutError` ("timed out"); the
        operation is still in flight and completes (or times out with the group) later."""
        limit = seconds(timeout)
        if not self._engine.wait(self._entry, limit):
            raise WaitTimeoutError(
                f"mpisync: rank {self._rank}: {self._entry.label} timed out: not complete "
                f"within {limit:g} s of Work.wait; it is still in flight",
                phase="Work.wait",
                pending=[self._entry.label],
            )
        self._entry.raise_error()
        return True

    def is_completed(self) -> bool:
        """Whether the operation finished (completed or failed)."""
        return self._entry.done

    def is_success(self) -> bool:
        """Whether the operation finished without an error."""
        return self._entry.done and self._entry.error is None

    def exception(self):
        """What the operation failed with, or None."""
        return self._entry.error

    def get_future(self):
        """A torch future completed (with the operation's tensors) when the operation is."""
        return self._engine.future(self._entry)

    def result(self) -> list:
        """The operation's output tensors."""
        result = self._entry.result
        return list(result) if isinstance(result, (list, tuple)) else [result]

    def _source_rank(self) -> int:
        """The sender's rank, after a receive from any source completed."""
        return -1 if self._source is None else self._source[0]

    source_rank = _source_rank


def joint(engine, entries: list) -> object:
    """One work for several operations (what ``_end_coalescing`` returns): complete when they
    all are, its future holding their results."""
    import torch
    from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

    futures = [engine.future(entry) for entry in entries]
    done: torch.futures.Future = torch.futures.Future()
    if not futures:
        done.set_result([])
        return _create_work_from_future(done)
    combined = torch.futures.collect_all(futures)
    return _create_work_from_future(combined.then(lambda f: [x.value() for x in f.value()]))
