"""``verify=True``: check with digests that every replica on every rank holds root's bytes.

Each parameter's digest is XXH3-128 (the ``xxhash`` package) over its bytes: one pass over each
buffer where it lies, no copy, at memory speed. XXH3 is not cryptographic: it catches corruption
(a changed byte, a torn or stale copy, two parameters' bytes swapped), not a peer that crafts a
collision. What travels between ranks are fixed-size int64 words, never pickles.
"""

from __future__ import annotations

import numpy as _np
import xxhash as _xxhash

from .._runtime.failfast import mark_everywhere
from ..errors import VerificationError
from .agreement import all_equal

__all__ = ["buffer_digest", "param_digests", "verify"]

#: Bytes of one :func:`buffer_digest`.
DIGEST_BYTES = 16

_xxh3_128 = _xxhash.xxh3_128_digest


def buffer_digest(data) -> bytes:
    """The 16-byte XXH3-128 digest of ``data``'s bytes, read in place.

    ``data`` is any object with the buffer protocol whose bytes are one C-contiguous block (a numpy
    array, a ``memoryview``, ``bytes``); a strided array is refused with numpy's ``ValueError`` (no
    copy is made: a parameter is contiguous by the time it is verified).
    """
    return _xxh3_128(data)


def param_digests(manifest, to_host=None) -> _np.ndarray:
    """An ``(n, 3)`` int64 array: each master's 16-byte digest, then 1 if every local replica
    equals it.

    ``to_host(view)`` copies a device replica's bytes to host memory.
    """
    n = manifest.tensors
    digests = bytearray(DIGEST_BYTES * n)
    same = _np.ones(n, dtype=_np.int64)
    at = 0
    for i, (master, others) in enumerate(manifest.replica_bytes(to_host)):
        digest = _xxh3_128(master)
        digests[at : at + DIGEST_BYTES] = digest
        at += DIGEST_BYTES
        for other in others:
            if _xxh3_128(other) != digest:
                same[i] = 0
                break
    rows = _np.empty((n, 3), dtype=_np.int64)
    rows[:, :2] = _np.frombuffer(digests, dtype=_np.int64).reshape(n, 2)
    rows[:, 2] = same
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
        total = _np.frombuffer(_xxh3_128(rows.data), dtype=_np.int64)
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
    raise mark_everywhere(
        VerificationError(
            f"mpisync: verification failed, bytes differ from root rank {root}'s: {shown}"
        ),
        comm,
    )
