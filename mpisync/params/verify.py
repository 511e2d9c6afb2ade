"""``verify=True``: check with digests that every replica on every rank holds root's bytes."""

from __future__ import annotations

import hashlib as _hashlib

import numpy as _np

from ..errors import VerificationError
from .agreement import all_equal

__all__ = ["param_digests", "verify"]


def _digest(data) -> bytes:
    return _hashlib.blake2b(data, digest_size=16).digest()


def param_digests(manifest, to_host=None) -> _np.ndarray:
    """An ``(n, 3)`` int64 array: each master's 16-byte digest, then 1 if every local replica
    equals it.

    ``to_host(view)`` copies a device replica's bytes to host memory.
    """
    rows = _np.empty((manifest.tensors, 3), dtype=_np.int64)
    for i, (master, others) in enumerate(manifest.replica_bytes(to_host)):
        digest = _digest(master)
        rows[i, :2] = _np.frombuffer(digest, dtype=_np.int64)
        rows[i, 2] = all(_digest(other) == digest for other in others)
    return rows


def verify(comm, manifest, root: int, call, to_host=None) -> int:
    """Raise :class:`VerificationError` on every rank unless all hold root's bytes; return
    collectives used.

    ``comm=None`` checks only this rank's replicas. With peers it costs one
    all-reduce when all agree, and an all-gather of the digests to name differences.
    """
    if comm is None and manifest.nreplicas == manifest.tensors:
        return 0  # one replica per name, the master: nothing to compare
    rows = param_digests(manifest, to_host)
    collectives = 0
    if comm is None:
        table, root = rows[None], 0
    else:
        total = _np.frombuffer(_digest(rows.tobytes()), dtype=_np.int64)
        _, equal = all_equal(comm, total, call)
        collectives = 1
        if equal and rows[:, 2].all():
            return collectives
        table = _np.empty((comm.size,) + rows.shape, dtype=_np.int64)
        call(comm.Iallgather(rows, table))
        collectives = 2
    reference = table[root, :, :2]
    bad: list[str] = []
    names = manifest.names
    for rank in range(table.shape[0]):
        wrong = (table[rank, :, :2] != reference).any(axis=1) | (table[rank, :, 2] == 0)
        bad.extend(f"rank {rank}: {names[i]!r}" for i in _np.nonzero(wrong)[0])
    if not bad:
        return collectives
    shown = "; ".join(bad[:20]) + (f"; ... and {len(bad) - 20} more" if len(bad) > 20 else "")
    raise VerificationError(
        f"mpisync: verification failed, bytes differ from root rank {root}'s: {shown}"
    )
