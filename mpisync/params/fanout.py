"""The local fan-out: each master's bytes into the rank's other replicas of the same name.

Every transport, the one-rank sync and the all-reduce fan out through these:
the columns' ``fan_out`` (:mod:`mpisync.params.columns`) or :func:`replica_copies`
lists the ``(destination, source)`` pairs once, when a program is compiled;
:func:`copy_host` or :func:`copy_device` carries them out once the masters hold
their bytes.
"""

from __future__ import annotations

__all__ = ["replica_copies", "copy_host", "copy_device", "fan_out"]


def replica_copies(params: list, indices) -> list:
    """``(destination, source)`` pairs copying the masters of ``params[i]`` (``i`` in ``indices``)
    into their other local replicas."""
    return [(r.data, params[i].master.data) for i in indices for r in params[i].replicas[1:]]


def copy_host(pairs) -> None:
    """Carry out host ``(destination, source)`` pairs (numpy views of the same size)."""
    for dst, src in pairs:
        dst[:] = src


def copy_device(pairs, backend, stream) -> None:
    """Enqueue device ``(destination, source)`` pairs on ``stream`` of ``backend``."""
    for dst, src in pairs:
        backend.copy(dst, src, stream)


def fan_out(params: list) -> None:
    """Copy every host master of ``params`` into its other replicas, now."""
    copy_host(replica_copies(params, range(len(params))))
