"""The errors of the ``"mpisync"`` torch backend.

Each is an :class:`mpisync.SyncError` (mpisync's own hierarchy) and a
``RuntimeError`` (what torch's backends raise, and what torch's callers catch).
"""

from __future__ import annotations

from ..errors import InvalidParamError, ManifestMismatchError, SyncError, SyncTimeoutError

__all__ = [
    "AgreedError",
    "ArgumentError",
    "CountError",
    "MismatchError",
    "OperationError",
    "OperationTimeoutError",
    "WaitTimeoutError",
]


class AgreedError(Exception):
    """Mixin of errors that every rank raises for the same operation at the same step: the
    operation fails and the group goes on (every rank's sequence of collectives still matches)."""


class OperationError(SyncError, RuntimeError):
    """An operation failed: an MPI error, or a group made unusable by an earlier failure."""


class ArgumentError(InvalidParamError, RuntimeError, AgreedError):
    """Invalid arguments for an operation, or one mpisync does not support (raised on every rank
    before anything is posted)."""


class MismatchError(ManifestMismatchError, RuntimeError, AgreedError):
    """Ranks passed different dtypes, sizes, split sizes, ops or roots to one operation (raised on
    every rank before anything is posted)."""


class CountError(OperationError):
    """A receive got a message of another size than its tensor."""


class WaitTimeoutError(SyncTimeoutError, RuntimeError):
    """``Work.wait(timeout)`` timed out; the operation itself is still in flight."""


class OperationTimeoutError(SyncTimeoutError, RuntimeError):
    """An operation did not complete within the group's timeout (``MPISYNC_TIMEOUT_ABORT=0``; by
    default the job aborts); the group is unusable."""
