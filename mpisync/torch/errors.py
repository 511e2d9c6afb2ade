"""The errors of the ``"mpisync"`` torch backend.

Each is an :class:`mpisync.SyncError` (mpisync's own hierarchy) and a
``RuntimeError`` (what torch's backends raise, and what torch's callers catch).
Import them from :mod:`mpisync.torch` (``mpisync.torch.MismatchError``).
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
    """An operation failed: an MPI error, or a group made unusable by an earlier failure.

    Raised by the operation's ``wait()`` (or the collective, without
    ``async_op``); after an error that may leave the ranks' sequences of
    collectives out of step, every later operation on the group raises it too:
    destroy the group and make a new one, or end the job.
    """


class ArgumentError(InvalidParamError, RuntimeError, AgreedError):
    """Invalid arguments for an operation, or one mpisync does not support.

    Also a ``ValueError`` (an :class:`mpisync.InvalidParamError`). Raised on
    every rank before anything is posted (a bitwise op on floating-point
    tensors, a sparse tensor where only dense ones go, ``monitored_barrier``);
    the group stays usable.
    """


class MismatchError(ManifestMismatchError, RuntimeError, AgreedError):
    """Ranks passed different dtypes, sizes, split sizes, ops or roots to one operation.

    An :class:`mpisync.ManifestMismatchError` too. Raised on every rank before
    anything is posted, naming the ranks of each value; the group stays usable.
    The argument check behind it is ``MPISYNC_TORCH_CHECK`` (opt-in: ``=1``).
    """


class CountError(OperationError):
    """A receive got a message of another size than its tensor.

    Raised by that ``recv``'s ``wait()`` only; the group stays usable.
    """


class WaitTimeoutError(SyncTimeoutError, RuntimeError):
    """``work.wait(timeout)`` timed out; the operation itself is still in flight.

    Wait again, or let the group's own timeout decide.
    """


class OperationTimeoutError(SyncTimeoutError, RuntimeError):
    """An operation did not complete within the group's timeout; the group is unusable.

    Raised only with ``MPISYNC_TIMEOUT_ABORT=0``: by default the diagnostic is
    written to stderr and the job aborted, since MPI cannot cancel a collective.
    """
