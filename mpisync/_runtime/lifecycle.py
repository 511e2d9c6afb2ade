"""What the reusable syncers (``ParamSync``, ``GradSync``) share: fixed settings, closing as a
context manager, releasing what they hold when dropped, and the state a call that did not finish
leaves them in.

A call that ends with requests still in flight (a timeout, or any other exception leaving a wait:
``KeyboardInterrupt``, ``SystemExit``, an MPI error) leaves the syncer *broken*: everything it
holds, and every frame the exception passed through, is kept for the rest of the process
(:func:`mpisync._runtime.keepalive.keep_alive`), because MPI may still write into those buffers;
its communicator is never freed; and its next call raises :class:`~mpisync.SyncError` before
posting anything, so no new collective can match the old ones. A broken syncer cannot be
repaired: MPI cannot cancel a collective.
"""

from __future__ import annotations

import weakref as _weakref

from mpi4py import MPI

from .. import config as _config
from ..errors import InvalidParamError, SyncError, SyncTimeoutError
from .failfast import install as install_failfast
from .keepalive import keep_alive
from .launch import check_launch

__all__ = [
    "Reusable",
    "check_comm",
    "duplicate",
    "free_comm",
    "interrupted",
    "release_when_collected",
    "settled",
    "wait_duplicate",
]


def settled(exc: BaseException) -> bool:
    """Whether ``exc``, leaving a syncer's call, leaves nothing of the call in flight: an mpisync
    error that every rank raises once the exchange that decided it completed (bad input, sets
    that differ, a failed verification). A timeout, and anything else (an interrupt,
    ``SystemExit``, an MPI or memory error), may leave requests posted."""
    return isinstance(exc, SyncError) and not isinstance(exc, SyncTimeoutError)


def interrupted(exc: BaseException, what: str, phase: str) -> str:
    """The reason a syncer is broken after ``exc`` left its call (``what``: ``"a sync"``, ...)
    during ``phase``. What the variables of every frame ``exc`` passed through hold (requests,
    their buffers, rings, programs) is kept: the frames themselves would keep their callers too."""
    tb = exc.__traceback__
    while tb is not None:
        keep_alive(dict(tb.tb_frame.f_locals))
        tb = tb.tb_next
    return (
        f"{what} was interrupted by {type(exc).__name__} during the {phase}; its collectives may "
        "still be pending"
    )


def duplicate(comm) -> tuple:
    """``comm.Idup()``'s ``(communicator, request)``; see :func:`wait_duplicate`."""
    try:
        return comm.Idup()
    except MPI.Exception as exc:
        raise _no_duplicate(exc) from None


def wait_duplicate(dup: tuple, call) -> MPI.Intracomm:
    """The communicator of ``dup`` (:func:`duplicate`'s pair) once ``call(request)`` completed it.

    ``SyncError`` where MPI could not duplicate (communicator context ids used up, most often):
    MPI decides that with every rank, so every rank raises it, with the same message."""
    comm, request = dup
    try:
        call(request)
    except MPI.Exception as exc:
        raise _no_duplicate(exc) from None
    return comm


def _no_duplicate(exc) -> SyncError:
    return SyncError(
        "mpisync: MPI could not duplicate the communicator "
        f"({MPI.Get_error_string(exc.Get_error_class())}): its communicator context ids are most "
        "likely used up by communicators never freed (close() syncers no longer needed, Free() "
        "communicators)"
    )


def free_comm(comm) -> None:
    """Free mpisync's duplicate ``comm`` (``None``: nothing), unless MPI is finalized already.

    ``MPI_Comm_free`` is collective in the standard, but MPICH and Open MPI free locally (the
    context id returns to this rank's pool; the next duplication agrees on an id free on every
    rank), so a rank may free its duplicate before or after the others."""
    if comm is not None and comm != MPI.COMM_NULL and not MPI.Is_finalized():
        comm.Free()


def release_when_collected(owner: object, release) -> _weakref.finalize:
    """Run ``release()`` once: when the returned finalizer is called (``close()``), or when
    ``owner`` is collected. ``release`` must not refer to ``owner``. Not at interpreter exit:
    the process's end frees descriptors and mappings, and ``MPI_Finalize`` communicators."""
    finalizer = _weakref.finalize(owner, release)
    finalizer.atexit = False
    return finalizer


def check_comm(comm) -> None:
    """``InvalidParamError`` unless ``comm`` is an mpi4py intracommunicator of a real launch (see
    :func:`mpisync._runtime.launch.check_launch`); the first call of every syncer checks."""
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise InvalidParamError(f"comm must be an mpi4py intracommunicator, got {comm!r}")
    if comm.Is_inter():
        raise InvalidParamError("comm is an intercommunicator; mpisync needs an intracommunicator")
    check_launch(comm)  # a world of one where the launcher started more
    install_failfast()  # MPI initialised after mpisync was imported (mpi4py.rc.initialize=False)


class Reusable:
    """A base for objects that hold the caller's communicator (``self._user_comm``) and
    ``self._settings`` for their life and free what they hold in ``close()``."""

    _settings: _config.Settings

    def _hold(self, comm, max_concurrent, fusion_bytes, gpu_transport, timeout) -> None:
        """Fix ``self._user_comm`` (``comm``, default ``MPI.COMM_WORLD``) and ``self._settings``
        (and ``self._values``) for the object's life. A bad setting is kept in
        ``self._settings_error`` and reported at the first call, collectively, like any bad
        input."""
        self._user_comm = MPI.COMM_WORLD if comm is None else comm
        self._settings_error = None
        try:
            self._settings = _config.resolve(max_concurrent, fusion_bytes, gpu_transport, timeout)
        except InvalidParamError as exc:
            self._settings_error = str(exc)
            self._settings = _config.resolve(
                1, 0, "auto", _config.BUILTIN_DEFAULTS["timeout"], environment=False
            )
        self._values = self._settings.values()  # read-only: the settings are fixed
        # agreed with every manifest: a rank whose transports or loops differ is an error
        self._wire = _config.wire_settings()

    @property
    def settings(self) -> _config.Settings:
        """The effective settings and where each came from."""
        return self._settings

    def close(self) -> None:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
