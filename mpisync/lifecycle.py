"""What the reusable syncers (``ParamSync``, ``GradSync``) share: fixed settings, closing as a context manager."""

from __future__ import annotations

from . import config as _config

__all__ = ["Reusable"]


class Reusable:
    """A base for objects that hold ``self._settings`` for their life and free what they hold in ``close()``."""

    _settings: _config.Settings

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
