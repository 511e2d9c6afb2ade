"""Facts about the MPI library and mpisync's effective settings, for ``mpisync info``.

Without an MPI library, :func:`collect_info` still reports the versions and settings, with
``mpi_library`` saying in one line what to install (``mpisync info`` exists to diagnose that).
"""

from __future__ import annotations

import importlib.metadata as _metadata
import os as _os
import platform as _platform

from .. import __version__
from .. import config as _config
from .._runtime import mpilib as _mpilib
from ..errors import InvalidParamError

__all__ = ["collect_info", "defaults_in_use", "settings_in_use"]


def _version(dist: str) -> str:
    try:
        return _metadata.version(dist)
    except _metadata.PackageNotFoundError:
        return "not installed"


def _versions() -> dict:
    """mpisync's version and those of what it runs on (no MPI call)."""
    return {
        "mpisync": __version__,
        "python": _platform.python_version(),
        "mpi4py": _version("mpi4py"),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
    }


def _setting_errors() -> list:
    return [
        f"{problem}; every sync raises until it is fixed or unset"
        for problem in _config.environment_problems()
    ]


def _without_mpi(problem: str) -> dict:
    """What ``mpisync info`` can say where no MPI library loads: the versions, the settings,
    and the one line naming what to install."""
    return {
        **_versions(),
        "mpi_library": f"none: {problem}",
        "defaults": defaults_in_use(),
        "settings": settings_in_use(),
        "setting_errors": _setting_errors(),
    }


def collect_info() -> dict:
    """Everything ``mpisync info`` prints, as a JSON-safe dict."""
    if _mpilib.PROBLEM is not None:
        return _without_mpi(_mpilib.PROBLEM)
    from mpi4py import MPI

    from .._runtime.launch import launch_status
    from ..devices.detect import choose_transport, cuda_aware_mpi, gpus_seen

    defaults = defaults_in_use()
    aware, aware_why = cuda_aware_mpi()
    transport, transport_why = choose_transport(defaults["gpu_transport"]["value"] or "auto")
    return {
        **_versions(),
        "mpi_library": _mpilib.library_name(MPI.Get_library_version()),
        "mpi_standard": "{}.{}".format(*MPI.Get_version()),
        "thread_level": f"MPI_THREAD_{_mpilib.thread_level().upper()}",
        "world_size": MPI.COMM_WORLD.size,
        "launch": launch_status(MPI.COMM_WORLD.size),
        "cuda_aware_mpi": "yes" if aware else "no",
        "cuda_aware_why": aware_why,
        "device_transport": f"{transport} ({transport_why})",
        "gpus": gpus_seen(),
        "defaults": defaults,
        "settings": settings_in_use(),
        "setting_errors": _setting_errors(),
        "unknown_settings": [
            f"{name} (ignored{f'; did you mean {near}?' if near else ''})"
            for name, near in _config.unknown_settings()
        ],
        "timeout_aborts": _config.abort_on_timeout(),
        "fail_fast": _fail_fast_line(),
        "cross_memory": _cross_memory_line(),
        "speedups": _speedups_line(),
        "host_transport": __import__("mpisync.transports.tuning", fromlist=["describe"]).describe(
            MPI.COMM_WORLD.size, True
        ),
    }


def defaults_in_use() -> dict:
    """Each setting's effective value and source; a bad environment value is reported, not raised:
    ``{"value": None, "source": "environment", "error": why}`` (a sync would raise that error)."""
    out = {}
    for name, env in _config.ENV_NAMES.items():
        try:
            # one at a time: a bad one does not hide the others
            setting = _config._resolve_one(name, None)
            out[name] = {"value": setting.value, "source": setting.source, "env": env}
        except InvalidParamError as exc:
            out[name] = {
                "value": None,
                "source": "environment",
                "env": env,
                "error": str(exc),
                "raw": _os.environ.get(env, ""),
            }
    return out


def settings_in_use() -> dict:
    """Every other setting mpisync reads (the switches, the log level, the files it writes),
    by environment variable: ``{"value": ..., "source": "environment" | "built-in"}``; an
    invalid switch shows the value its default takes and ``"invalid": raw`` (every sync then
    raises, as ``setting_errors`` says)."""
    out: dict = {}
    for name, default in _config.SWITCHES.items():
        raw = _os.environ.get(name, "").strip()
        entry: dict = {
            "value": _config.switch(name),
            "source": "environment" if raw else "built-in",
        }
        if raw and not _config.is_switch_value(raw):
            entry["invalid"] = raw
        if default is None and entry["value"] is None:
            entry["value"] = "auto"
        out[name] = entry
    for name in ("MPISYNC_LOG", *_config.PATHS):
        raw = _os.environ.get(name, "").strip()
        out[name] = {"value": raw or None, "source": "environment" if raw else "built-in"}
    return out


def _fail_fast_line() -> str:
    if not _config.env_switch("MPISYNC_FAIL_FAST", True):
        return (
            "off (MPISYNC_FAIL_FAST=0): one rank's uncaught exception or exit leaves the others "
            "to their timeout"
        )
    return (
        "on (MPISYNC_FAIL_FAST=0 turns it off): under a launcher, an uncaught exception on any "
        "rank aborts the job, and a rank that exits ends the others' waits on it"
    )


def _switch_line(enabled, on: str, off: str, unavailable: str) -> str:
    """One channel's line: ``enabled()`` (as set here), ``enabled(True)`` (if asked for) decide
    which."""
    return on if enabled() else off if enabled(True) else unavailable


def _cross_memory_line() -> str:
    from ..transports.cma import enabled

    return _switch_line(
        enabled,
        "on (MPISYNC_CROSS_MEMORY=0 turns it off): process-to-process copies for sets with large "
        "tensors, where every rank is on one node (see host_transport)",
        "off (MPISYNC_CROSS_MEMORY=0)",
        "not available here (needs Linux process_vm_readv/process_vm_writev)",
    )


def _speedups_line() -> str:
    from .._runtime.speedups import enabled

    return _switch_line(
        enabled,
        "on (MPISYNC_SPEEDUPS=0 turns them off): C loops pack and unpack fusion buckets, check "
        "a reused parameter set, and read first syncs of plain numpy sets in one pass",
        "off (MPISYNC_SPEEDUPS=0): the Python form of every loop, the same program",
        "not built (no C compiler when mpisync was installed): the Python form of every loop, "
        "the same program",
    )
