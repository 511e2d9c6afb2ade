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
    """Ranks disagree about an operation; raised on every rank of the process set.

    Raised by :func:`synchronize` and the blocking collectives when the ranks' descriptions
    of one operation name differ (kind, dtype, shape, root rank, reduction op, scale
    factors), when every rank waits and no operation is pending on all of them (they called
    different operations), or when an operation other than an all-reduce meets a rank that
    called :func:`join`. Every rank gets the same message, naming what each rank submitted;
    no data has moved. Also raised on every rank, naming the rank and its error, when an
    operation's run fails on some ranks only (a dtype its reduction cannot convert, say).
    A :class:`RuntimeError`, as Horovod's, and an :class:`mpisync.SyncError`.
    """


class HorovodArgumentError(InvalidParamError):
    """An operation's arguments are invalid (on this rank, or on another rank of the set).

    Raised on every rank of the set by :func:`synchronize` and the blocking collectives when
    any rank's arguments were refused (a root rank outside the set, alltoall splits that do
    not fit, a sparse or meta tensor), naming the ranks and why; and on this rank alone when
    an operation is submitted under a name already pending, or on a process set that was not
    added or does not hold this rank. A :class:`ValueError`, as Horovod's, and an
    :class:`mpisync.InvalidParamError`.
    """
