"""The exceptions mpisync raises.

Every error that depends on what another rank holds is raised on *every* rank
of the communicator, with the same type and message.
"""

__all__ = [
    "SyncError",
    "ManifestMismatchError",
    "InvalidParamError",
    "SyncTimeoutError",
    "VerificationError",
]


class SyncError(Exception):
    """Base class of every mpisync error."""


class ManifestMismatchError(SyncError):
    """Names, shapes, dtypes, counts or sync settings differ between ranks."""


class InvalidParamError(SyncError, ValueError):
    """An argument cannot be synced: unsupported object, layout, dtype or root."""


class SyncTimeoutError(SyncError):
    """A collective did not complete within the timeout."""


class VerificationError(SyncError):
    """``verify=True`` found a rank whose bytes differ from the root's."""
