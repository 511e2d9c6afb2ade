"""What the reusable syncers (``ParamSync``, ``GradSync``) share: fixed settings, closing as a
context manager."""

from __future__ import annotations

from mpi4py import MPI

from .. import config as _config
from ..errors import InvalidParamError
from .failfast import install as install_failfast
from .launch import check_launch

__all__ = ["Reusable", "check_comm"]


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
