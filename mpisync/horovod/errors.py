"""The errors a Horovod script catches, as mpisync errors.

:class:`HorovodInternalError` is what Horovod raises when ranks disagree (shapes, dtypes, root
ranks, operations): a :class:`RuntimeError`, and an :class:`~mpisync.SyncError`. Bad arguments
(an alltoall split that does not fit, a name already in flight) are
:class:`HorovodArgumentError`, a :class:`ValueError` as in Horovod and an
:class:`~mpisync.InvalidParamError`.
"""

from __future__ import annotations

from ..errors import InvalidParamError, SyncError

__all__ = ["HorovodInternalError", "HorovodArgumentError"]


class HorovodInternalError(SyncError, RuntimeError):
    """Ranks disagree about an operation; raised on every rank of the process set."""


class HorovodArgumentError(InvalidParamError):
    """An operation's arguments are invalid (on this rank, or on another rank of the set)."""
