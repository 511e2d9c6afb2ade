"""An operation's run with its failures agreed between the ranks.

Once the ranks have agreed that an operation runs, its run may still fail on one rank only (a
dtype its kernel cannot convert, a tensor freed meanwhile). The others would then post a
collective that rank never posts and wait out the whole timeout. Here every nonblocking
collective of the run is preceded by an agreement (one small all-reduce) that no rank has failed
so far, and the run ends with one more: a rank that fails takes part in the next agreement with
its error instead, and every rank raises the same :class:`RunError` at once, naming each failed
rank and its error (or, where every rank failed with the same mpisync error, that error: the
run's own code agreed on it). The agreements are the same in number and order on every rank up
to the failure, so the communicator's sequence of collectives still matches afterwards.
"""

from __future__ import annotations

from typing import Any

from .._runtime.ring import Expired
from ..errors import SyncError
from ..params.agreement import allgather_bytes, max_and_min, merge_ranks
from .errors import HorovodInternalError

__all__ = ["RunError", "guarded_run"]


class RunError(HorovodInternalError):
    """An operation's run failed on some rank(s); every rank of the set raises it alike."""


def _agree(comm, call, name: str, failure: str, error: BaseException | None = None) -> None:
    """Raise the same :class:`RunError` on every rank if any rank's ``failure`` is not empty
    (``error`` itself where it is mpisync's and every rank failed with the same text)."""
    high, low = max_and_min(comm, [1 if failure else 0], call)
    if not high[0]:
        return
    texts = allgather_bytes(comm, failure.encode(), call)
    if isinstance(error, SyncError) and low[0] and len(set(texts)) == 1:
        raise error  # mpisync's own error, raised alike on every rank: agreed already
    shown = merge_ranks((r, t.decode(errors="replace")) for r, t in enumerate(texts) if t)
    raise RunError(f"mpisync.horovod: operation {name!r} failed: " + "; ".join(shown))


class _GuardedComm:
    """``comm`` whose nonblocking collectives (its ``I*`` methods) each start with an
    agreement that no rank has failed so far."""

    def __init__(self, comm, call, name: str):
        self._comm, self._call, self._name = comm, call, name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._comm, attr)
        if not (attr.startswith("I") and callable(value)):
            return value

        def posted(*args, **kwargs):
            _agree(self._comm, self._call, self._name, "")
            return value(*args, **kwargs)

        return posted


def guarded_run(op, comm, call, descs: list) -> Any:
    """``op.run(comm, call, descs)``, its failure on any rank raised on every rank as the same
    :class:`RunError` (a timeout propagates as it is)."""
    try:
        result = op.run(_GuardedComm(comm, call, op.name), call, descs)
    except (RunError, Expired):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever it is, every rank hears of it
        _agree(comm, call, op.name, f"{type(exc).__name__}: {exc}", exc)
        raise  # not reached: the agreement raised
    _agree(comm, call, op.name, "")
    return result
