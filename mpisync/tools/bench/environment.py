"""What a bench run ran on: enough to compare two clusters' JSON files, or two versions' runs.

Hosts and ranks per host, the CPU, the MPI library with the device or transport it reports, every
library's version and mpisync's settings (:func:`describe`). The host names travel as
fixed-size bytes (``Allgather``), never pickled.
"""

from __future__ import annotations

import importlib.metadata as _metadata
import platform as _platform
import socket as _socket

import numpy as _np
from mpi4py import MPI

from ... import __version__
from ..._runtime import mpilib as _mpilib

__all__ = ["describe", "cpu_model", "mpi_transport"]

_NAME_BYTES = 256


def describe(comm) -> dict:
    """The run's environment (collective: every rank calls it; every rank gets the same dict)."""
    from ..info import defaults_in_use, settings_in_use

    hosts = _hosts(comm)
    per_host = {host: hosts.count(host) for host in sorted(set(hosts))}
    version = MPI.Get_library_version()
    return {
        "hosts": sorted(per_host),
        "nodes": len(per_host),
        "ranks_per_node": per_host,
        "cpu": cpu_model(),
        "machine": _platform.machine(),
        "system": _platform.platform(),
        "mpi_library": _mpilib.library_name(version),
        "mpi_version": " ".join(version.strip().splitlines()[0].split()),
        "mpi_transport": mpi_transport(version),
        "versions": {
            "mpisync": __version__,
            "python": _platform.python_version(),
            **{name: _version(name) for name in ("mpi4py", "numpy", "torch")},
        },
        "settings": {
            **{name: d.get("value") for name, d in defaults_in_use().items()},
            **{name: d["value"] for name, d in settings_in_use().items()},
        },
    }


def _hosts(comm) -> list:
    """Every rank's host name, in rank order."""
    mine = _np.zeros(_NAME_BYTES, _np.uint8)
    name = _socket.gethostname().encode()[:_NAME_BYTES]
    mine[: len(name)] = _np.frombuffer(name, _np.uint8)
    everyone = _np.zeros((comm.size, _NAME_BYTES), _np.uint8)
    comm.Allgather(mine, everyone)
    return [row.tobytes().rstrip(b"\0").decode(errors="replace") for row in everyone]


def cpu_model() -> str:
    """The CPU's model as the kernel names it (``/proc/cpuinfo``), else what Python knows."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(
                (k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in f) if v
            )
    except OSError:
        fields = {}
    for key in ("model name", "Model", "cpu model"):
        if fields.get(key):
            return fields[key]
    if "CPU part" in fields:  # arm64: the implementer and part numbers
        return (
            f"{_platform.machine()} implementer {fields.get('CPU implementer')} part "
            + (fields["CPU part"])
        )
    return _platform.processor() or _platform.machine()


def mpi_transport(version: str) -> str:
    """The device or transport the MPI library reports in its version text (MPICH and Intel
    MPI: their device line); ``"not reported"`` where it says none."""
    for line in version.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("MPICH Device", "Intel(R) MPI Library Device"):
            return " ".join(value.split())
    return "not reported"


def _version(name: str) -> str:
    try:
        return _metadata.version(name)
    except _metadata.PackageNotFoundError:
        return "not installed"
