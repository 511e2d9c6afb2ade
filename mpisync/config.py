"""Internal, no stability promise: settings resolution (public: the ``MPISYNC_*`` variables).

Effective settings: an explicit argument, else the environment, else a built-in default.

Each resolved value remembers where it came from, so ``mpisync info`` can say so. Every
``MPISYNC_*`` variable the package reads is named here, once: the four tunables
(:data:`ENV_NAMES`), the on/off switches (:data:`SWITCHES`), the log level and the two paths.
A value that cannot be parsed is refused, naming the variable; an ``MPISYNC_*`` name that is
none of these (a misspelt name, say) is warned about once and shown by
``mpisync info``.
"""

from __future__ import annotations

import dataclasses as _dc
import difflib as _difflib
import os as _os
import sys as _sys
import warnings as _warnings
from collections.abc import Mapping
from typing import Any, Generic, TypedDict, TypeVar

from .errors import InvalidParamError

__all__ = [
    "Setting",
    "Settings",
    "SettingValues",
    "resolve",
    "env_switch",
    "switch",
    "wire_settings",
    "WIRE_SWITCHES",
    "check_environment",
    "environment_problems",
    "unknown_settings",
    "BUILTIN_DEFAULTS",
    "ENV_NAMES",
    "SWITCHES",
    "LOG_LEVELS",
    "KNOWN_ENV",
    "PATHS",
    "is_switch_value",
]

GPU_TRANSPORTS = ("auto", "cuda-aware", "staged")

#: Built-in defaults; docs/performance.md, "The defaults" says how they were chosen.
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

#: The on/off switches and their defaults (``None``: unset leaves the choice to the rule).
SWITCHES: dict[str, bool | None] = {
    "MPISYNC_CROSS_MEMORY": True,
    "MPISYNC_SPEEDUPS": True,
    "MPISYNC_TIMEOUT_ABORT": True,
    "MPISYNC_ALLOW_SINGLETON": False,
    "MPISYNC_TORCH_CHECK": False,
    "MPISYNC_TORCH_SYNC_PARAMS": True,
    "MPISYNC_FAIL_FAST": True,
}
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")

#: ``MPISYNC_LOG``'s levels (any case); unset or empty: no log handler.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
#: The environment variables that name files mpisync writes or reads.
PATHS = ("MPISYNC_TIMELINE", "MPISYNC_TUNING")
#: For the with/without figures: C loops to replace with their Python form (comma-separated names).
_BENCH = ("MPISYNC_SPEEDUPS_WITHOUT",)
#: Read by the project's own CI scripts and tests, never by the package: known, not warned about.
_TOOLING = (
    "MPISYNC_TEST_LOGS",
    "MPISYNC_SKIP_OPENMPI",
    "MPISYNC_SKIP_MULTIHOST",
    "MPISYNC_SKIP_SLURM",
    "MPISYNC_SKIP_FRAMEWORKS",
    "MPISYNC_SKIP_IMPI",
    "MPISYNC_TORCH_VERSION",
    "MPISYNC_TORCH_INDEX",
    "MPISYNC_TORCH_BUILD",
    "MPISYNC_NEWEST_TORCH",
    "MPISYNC_SKIP_NEWEST_TORCH",
    "MPISYNC_OLDEST_TORCH",
    "MPISYNC_SKIP_OLDEST_TORCH",
    "MPISYNC_WITHOUT_TORCH",
    "MPISYNC_GPU_CHECK_SECONDS",
    "MPISYNC_GPU_PYTHON",
    "MPISYNC_REQUIRE_GPU",
    "MPISYNC_CHECK_LIBDIR",
    "MPISYNC_EXPECT_NODES",
    "MPISYNC_LINK_RATE",
)
#: Every ``MPISYNC_*`` name that means something; any other is reported as unknown.
KNOWN_ENV = frozenset([*ENV_NAMES.values(), *SWITCHES, "MPISYNC_LOG", *PATHS, *_BENCH, *_TOOLING])


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


def resolve(
    max_concurrent=None, fusion_bytes=None, gpu_transport=None, timeout=None, *, environment=True
) -> Settings:
    """Resolve every setting: argument if not ``None``, else environment, else built-in.

    ``timeout`` of ``0``, ``inf`` or ``"none"`` (from the environment) means wait forever. With
    ``environment`` (the default) the switches and ``MPISYNC_LOG`` are checked too
    (:func:`check_environment`): a value none of them takes raises here.
    """
    if environment:
        check_environment()
    return Settings(
        max_concurrent=_resolve_one("max_concurrent", max_concurrent),
        fusion_bytes=_resolve_one("fusion_bytes", fusion_bytes),
        gpu_transport=_resolve_one("gpu_transport", gpu_transport),
        timeout=_resolve_one("timeout", timeout),
    )


def is_switch_value(raw: str) -> bool:
    """Whether ``raw`` is a value an on/off switch takes (any case, spaces around ignored)."""
    return raw.strip().lower() in _ON + _OFF


def _parse_switch(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise InvalidParamError(
        f"{name}: an on/off switch takes 1, 0, true, false, yes, no, on or off (any case), "
        f"got {raw!r}"
    )


def switch(name: str) -> bool | None:
    """The on/off switch ``name`` (one of :data:`SWITCHES`): its default when unset, empty or not
    a valid switch. Never raises: :func:`resolve` refuses the invalid value, so every sync
    raises before anything reads it."""
    raw = _os.environ.get(name, "")
    if not raw.strip():
        return SWITCHES[name]
    try:
        return _parse_switch(name, raw)
    except InvalidParamError:
        return SWITCHES[name]


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment variable: ``default`` when unset, empty or invalid (see
    :func:`switch`), else its value."""
    value = switch(name) if name in SWITCHES else None
    return default if value is None else value


#: The switches that change what travels between ranks or how it is checked: ranks must agree.
WIRE_SWITCHES = ("MPISYNC_CROSS_MEMORY", "MPISYNC_SPEEDUPS")


def wire_settings(torch: bool = False) -> dict[str, Any]:
    """This rank's values of the settings every rank must share (the syncers agree on them with
    the parameters, a torch process group (``torch=True``: ``MPISYNC_TORCH_CHECK`` and
    ``MPISYNC_TORCH_SYNC_PARAMS`` too) when it is created): a difference is an error on every
    rank, naming the setting and the ranks."""
    names = WIRE_SWITCHES + (("MPISYNC_TORCH_CHECK", "MPISYNC_TORCH_SYNC_PARAMS") if torch else ())
    values: dict[str, Any] = {name: switch(name) for name in names}
    values["MPISYNC_SPEEDUPS_WITHOUT"] = _os.environ.get("MPISYNC_SPEEDUPS_WITHOUT", "").strip()
    return values


def abort_on_timeout() -> bool:
    """Whether a timeout aborts the job (default) or only raises (``MPISYNC_TIMEOUT_ABORT=0``)."""
    return env_switch("MPISYNC_TIMEOUT_ABORT", True)


def environment_problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """Why each set switch or ``MPISYNC_LOG`` cannot be parsed, each naming its variable."""
    environ = _os.environ if environ is None else environ
    problems = []
    for name in SWITCHES:
        raw = environ.get(name, "")
        if raw.strip():
            try:
                _parse_switch(name, raw)
            except InvalidParamError as exc:
                problems.append(str(exc))
    level = environ.get("MPISYNC_LOG", "")
    if level.strip() and level.strip().lower() not in LOG_LEVELS:
        problems.append(
            f"MPISYNC_LOG: a log level takes {', '.join(LOG_LEVELS)} (any case), got {level!r}"
        )
    return problems


def unknown_settings(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for each ``MPISYNC_*`` variable mpisync does not
    know."""
    environ = _os.environ if environ is None else environ
    known = sorted(k.removeprefix("MPISYNC_") for k in KNOWN_ENV)  # the shared prefix matches all

    def closest(name: str) -> str | None:
        found = _difflib.get_close_matches(name.removeprefix("MPISYNC_"), known, n=1)
        return f"MPISYNC_{found[0]}" if found else None

    return [
        (name, closest(name))
        for name in sorted(environ)
        if name.startswith("MPISYNC_") and name not in KNOWN_ENV
    ]


def _world_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() and not MPI.Is_finalized() else 0


_warned: set[str] = set()
_scanned = False


def _warn_unknown() -> None:
    """Warn once per process (on rank 0 of the job only) about each unknown ``MPISYNC_*`` name."""
    global _scanned
    _scanned = True
    unknown = [(n, near) for n, near in unknown_settings() if n not in _warned]
    if not unknown:
        return
    _warned.update(name for name, _ in unknown)
    if _world_rank() != 0:  # one warning per job, not one per rank
        return
    # the warning points at the caller's line: the first frame outside this package
    package, frame, level = _os.path.dirname(__file__), _sys._getframe(0), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    for name, near in unknown:
        hint = f"; did you mean {near}?" if near else ""
        _warnings.warn(
            f"mpisync: {name} is not an mpisync setting and is ignored{hint} "
            "(`mpisync info` lists every setting)",
            UserWarning,
            stacklevel=level,
        )


def check_environment() -> None:
    """Raise :class:`InvalidParamError` for the first switch or log level that cannot be parsed;
    warn once about unknown ``MPISYNC_*`` names."""
    if not _scanned:
        _warn_unknown()
    problems = environment_problems()
    if problems:
        raise InvalidParamError("; ".join(problems))
