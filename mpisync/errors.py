"""The exceptions mpisync raises.

Every error that depends on what another rank holds is raised on *every* rank
of the communicator, with the same type and message.
"""

from __future__ import annotations

__all__ = [
    "SyncError",
    "ManifestMismatchError",
    "InvalidParamError",
    "SyncTimeoutError",
    "VerificationError",
    "PeerExitedError",
]


class SyncError(Exception):
    """Base class of every mpisync error.

    Catch it to handle any failure of a sync, an all-reduce or the torch backend; the
    message names the ranks and parameters involved. Also raised as such when a
    closed or unusable ``ParamSync`` or ``GradSync`` is used again.
    """


class ManifestMismatchError(SyncError):
    """Names, shapes, dtypes, replica counts or sync settings differ between ranks.

    Raised on every rank, naming the first differing parameters and the ranks
    of each value; nothing was written.
    """


class InvalidParamError(SyncError, ValueError):
    """An argument cannot be synced: unsupported object, layout, dtype, setting or root.

    Also a ``ValueError``. Raised on every rank when any rank's input is bad
    (a non-contiguous array, a read-only array on a receiving rank, replicas
    that disagree in shape or dtype, ``root`` out of range, a world of one
    process where the launcher started more); nothing was written.
    """


class SyncTimeoutError(SyncError):
    """A collective did not complete within the timeout.

    MPI cannot cancel a collective: by default the diagnostic is written to
    stderr and the job aborted (``comm.Abort``); with ``MPISYNC_TIMEOUT_ABORT=0``
    this error is raised instead, and the object that timed out is unusable.

    Args:
        message: What timed out, on which ranks, and what to check.
        phase: The step of the call that waited (``"validation exchange"``, ``"broadcast"``,
            ...); kept as the attribute ``phase``.
        pending: The parameter names still in flight; kept as the attribute ``pending``.
    """

    def __init__(self, message: str = "", *, phase: str = "", pending: list | None = None) -> None:
        super().__init__(message)
        self.phase = phase
        self.pending = list(pending or ())


class VerificationError(SyncError):
    """``verify=True`` found a rank whose bytes differ from the root's.

    Raised on every rank, naming the ranks that differ.
    """


class PeerExitedError(SyncTimeoutError):
    """A collective cannot complete: a rank of its communicator has already ended its script.

    A :class:`SyncTimeoutError` too (the wait ends as a timeout would, only sooner), so code that
    handles a wait that cannot complete catches both (``MPISYNC_FAIL_FAST=0`` turns the
    watch off).

    Args:
        message: Which ranks left and what was waiting.
        phase: The step of the call that waited; kept as the attribute ``phase``.
        pending: The parameter names still in flight; kept as the attribute ``pending``.
        ranks: The ranks that ended their script; kept as the attribute ``ranks``.
    """

    def __init__(
        self,
        message: str = "",
        *,
        phase: str = "",
        pending: list | None = None,
        ranks: list | None = None,
    ) -> None:
        super().__init__(message, phase=phase, pending=pending)
        self.ranks = list(ranks or ())
