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
    """Base class of every mpisync error."""


class ManifestMismatchError(SyncError):
    """Names, shapes, dtypes, counts or sync settings differ between ranks."""


class InvalidParamError(SyncError, ValueError):
    """An argument cannot be synced: unsupported object, layout, dtype or root."""


class SyncTimeoutError(SyncError):
    """A collective did not complete within the timeout: ``phase`` says which step of the sync
    waited, ``pending`` the parameter names still in flight."""

    def __init__(self, message: str = "", *, phase: str = "", pending: list | None = None):
        super().__init__(message)
        self.phase = phase
        self.pending = list(pending or ())


class VerificationError(SyncError):
    """``verify=True`` found a rank whose bytes differ from the root's."""


class PeerExitedError(SyncTimeoutError):
    """A collective cannot complete: a rank of its communicator has already ended its script.

    A :class:`SyncTimeoutError` too (the wait ends as a timeout would, only sooner), so code that
    handles a wait that cannot complete catches both. ``ranks`` lists the ranks that left."""

    def __init__(
        self,
        message: str = "",
        *,
        phase: str = "",
        pending: list | None = None,
        ranks: list | None = None,
    ):
        super().__init__(message, phase=phase, pending=pending)
        self.ranks = list(ranks or ())
