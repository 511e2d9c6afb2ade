"""Effective settings: an explicit argument, else the environment, else a built-in default.

Each resolved value remembers where it came from, so ``mpisync info`` can say so.
"""

from __future__ import annotations

import dataclasses as _dc
import os as _os
from typing import Any, Generic, TypedDict, TypeVar

from .errors import InvalidParamError

__all__ = [
    "Setting",
    "Settings",
    "SettingValues",
    "resolve",
    "env_switch",
    "BUILTIN_DEFAULTS",
    "ENV_NAMES",
]

GPU_TRANSPORTS = ("auto", "cuda-aware", "staged")

#: Built-in defaults; the README's Performance section says how they were chosen.
BUILTIN_DEFAULTS: dict[str, Any] = {
    "max_concurrent": 16,
    "fusion_bytes": 256 << 10,
    "gpu_transport": "auto",
    "timeout": 300.0,
}

ENV_NAMES = {
    "max_concurrent": "MPISYNC_MAX_CONCURRENT",
    "fusion_bytes": "MPISYNC_FUSION_BYTES",
    "gpu_transport": "MPISYNC_GPU_TRANSPORT",
    "timeout": "MPISYNC_TIMEOUT",
}


_T = TypeVar("_T")


@_dc.dataclass(frozen=True)
class Setting(Generic[_T]):
    """One effective value and its source: ``"argument"``, ``"environment"`` or ``"built-in"``."""

    value: _T
    source: str


class SettingValues(TypedDict):
    """The effective values alone, by name (``Settings.values()``)."""

    max_concurrent: int
    fusion_bytes: int
    gpu_transport: str
    timeout: float | None


@_dc.dataclass(frozen=True)
class Settings:
    """The effective values of every tunable of a sync."""

    max_concurrent: Setting[int]
    fusion_bytes: Setting[int]
    gpu_transport: Setting[str]
    timeout: Setting[float | None]

    def values(self) -> SettingValues:
        """The values alone, by name."""
        return SettingValues(
            max_concurrent=self.max_concurrent.value,
            fusion_bytes=self.fusion_bytes.value,
            gpu_transport=self.gpu_transport.value,
            timeout=self.timeout.value,
        )


def _parse_int(name: str, raw: object, minimum: int) -> int:
    try:
        value = int(raw)  # type: ignore[call-overload]  # any object: TypeError is caught
        if isinstance(raw, float) and raw != value:
            raise ValueError
    except (TypeError, ValueError):
        raise InvalidParamError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise InvalidParamError(f"{name} must be >= {minimum}, got {value}")
    return value


def _parse_timeout(raw: object) -> float | None:
    if isinstance(raw, str) and raw.strip().lower() in ("", "none", "inf", "0"):
        return None
    try:
        value = float(raw)  # type: ignore[arg-type]  # any object: TypeError is caught
    except (TypeError, ValueError):
        raise InvalidParamError(f"timeout must be a number of seconds, got {raw!r}") from None
    if value != value or value < 0:
        raise InvalidParamError(f"timeout must be >= 0 seconds, got {raw!r}")
    return None if value in (0.0, float("inf")) else value


def _parse(name: str, raw: object) -> Any:
    if name == "max_concurrent":
        return _parse_int(name, raw, 1)
    if name == "fusion_bytes":
        return _parse_int(name, raw, 0)
    if name == "timeout":
        return _parse_timeout(raw)
    value = str(raw).strip().lower()
    if value not in GPU_TRANSPORTS:
        raise InvalidParamError(f"gpu_transport must be one of {GPU_TRANSPORTS}, got {raw!r}")
    return value


def _resolve_one(name: str, argument: object) -> Setting[Any]:
    if argument is not None:
        return Setting(_parse(name, argument), "argument")
    raw = _os.environ.get(ENV_NAMES[name])
    if raw is not None and raw.strip() != "":
        try:
            return Setting(_parse(name, raw), "environment")
        except InvalidParamError as exc:
            raise InvalidParamError(f"{ENV_NAMES[name]}: {exc}") from None
    return Setting(BUILTIN_DEFAULTS[name], "built-in")


def resolve(max_concurrent=None, fusion_bytes=None, gpu_transport=None, timeout=None) -> Settings:
    """Resolve every setting: argument if not ``None``, else environment, else built-in.

    ``timeout`` of ``0``, ``inf`` or ``"none"`` (from the environment) means wait forever.
    """
    return Settings(
        max_concurrent=_resolve_one("max_concurrent", max_concurrent),
        fusion_bytes=_resolve_one("fusion_bytes", fusion_bytes),
        gpu_transport=_resolve_one("gpu_transport", gpu_transport),
        timeout=_resolve_one("timeout", timeout),
    )


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable: ``default`` unless it spells the other choice
    (``0``/``false``/``no``/``off`` against a default of on, ``1``/``true``/``yes``/``on`` against
    off)."""
    value = _os.environ.get(name, "").strip().lower()
    return (
        value not in ("0", "false", "no", "off") if default else value in ("1", "true", "yes", "on")
    )


def abort_on_timeout() -> bool:
    """Whether a timeout aborts the job (default) or only raises (``MPISYNC_TIMEOUT_ABORT=0``)."""
    return env_switch("MPISYNC_TIMEOUT_ABORT", True)
