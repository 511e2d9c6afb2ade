"""torch's work object for one operation of the engine."""

from __future__ import annotations

import datetime as _datetime

import torch.distributed as dist

from .errors import WaitTimeoutError

__all__ = [
    "FutureWork",
    "Work",
    "from_future",
    "hold",
    "joint",
    "release",
    "seconds",
    "torch_maker",
]

# Python works that torch's C++ may still call. A work returned to C++ (DDP's parameter check,
# its broadcasts, its buckets' hook) may keep only its C++ part alive: once the Python object is
# collected, C++ calls the base class's methods, and a base ``wait`` never returns (DDP hangs on
# torch 2.4 and 2.5). Where torch's C++ keeps the Python object itself, holding it changes
# nothing. A work is held until it was waited for or its future completed; beyond ``_HELD_MAX``
# works, the finished ones of the older half are let go, so one nobody waits for is not kept.
_held: dict[int, object] = {}
_HELD_MAX = 4096


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
        hold(self)

    def wait(self, timeout=None) -> bool:
        """Wait for the operation (at most ``timeout``); raise what it failed with. A wait that
        times out raises :class:`~mpisync.torch.errors.WaitTimeoutError` ("timed out"); the
        operation is still in flight and completes (or times out with the group) later."""
        limit = seconds(timeout)
        done = self._engine.wait(self._entry, limit)
        if done:
            release(self)
        else:
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
        future = self._engine.future(self._entry)
        future.add_done_callback(lambda _: release(self))
        return future

    def _finished(self) -> bool:
        return self._entry.done

    def result(self) -> list:
        """The operation's output tensors."""
        result = self._entry.result
        return list(result) if isinstance(result, (list, tuple)) else [result]

    def _source_rank(self) -> int:
        """The sender's rank, after a receive from any source completed."""
        return -1 if self._source is None else self._source[0]

    source_rank = _source_rank


def hold(work) -> None:
    """Keep ``work``'s Python object alive for torch's C++ until :func:`release`; past
    ``_HELD_MAX`` held works, the finished ones of the older half are released."""
    _held[id(work)] = work
    if len(_held) > _HELD_MAX:
        for key, held in list(_held.items())[: _HELD_MAX // 2]:
            if getattr(held, "_finished", lambda: True)():
                _held.pop(key, None)


def release(work) -> None:
    """``work`` was waited for (or its future completed): its caller is done with it."""
    _held.pop(id(work), None)


def joint(engine, entries: list) -> object:
    """One work for several operations (what ``_end_coalescing`` returns): complete when they
    all are, its future holding their results."""
    import torch

    futures = [engine.future(entry) for entry in entries]
    if not futures:
        done: torch.futures.Future = torch.futures.Future()
        done.set_result([])
        return from_future(done, torch_maker())
    combined = torch.futures.collect_all(futures)
    return from_future(combined.then(lambda f: [x.value() for x in f.value()]), torch_maker())


def torch_maker():
    """torch's ``_create_work_from_future`` (a work all in C++), or None where it has none."""
    from torch._C import _distributed_c10d

    return getattr(_distributed_c10d, "_create_work_from_future", None)


def from_future(future, make) -> object:
    """A torch work over ``future``: ``make(future)`` (:func:`torch_maker`), or a
    :class:`FutureWork` where ``make`` is None."""
    return make(future) if make is not None else FutureWork(future)


class FutureWork(dist._Work):
    """A work over a torch future, kept for torch's C++ as :class:`Work` is (:func:`hold`)."""

    def __init__(self, future):
        super().__init__()
        self._future = future
        hold(self)

    def wait(self, timeout=None) -> bool:
        """Wait for the future; raise what it failed with."""
        try:
            self._future.wait()
        finally:
            release(self)
        return True

    def is_completed(self) -> bool:
        """Whether the future is done."""
        return self._future.done()

    def _finished(self) -> bool:
        return self._future.done()

    def get_future(self):
        """The future itself."""
        return self._future

    def result(self) -> list:
        """The future's value, as a list."""
        value = self._future.value()
        return list(value) if isinstance(value, (list, tuple)) else [value]
