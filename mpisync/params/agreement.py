"""Agree, across every rank, that a sync may start, or on the one error all ranks raise.

The happy path costs one ``Iallreduce`` of a few integers: a flag for local
errors and the manifest digest, reduced with MAX together with its bitwise
complement (``max(~x) == ~min(x)``), so every rank learns whether min == max.
Only when something differs do ranks exchange their JSON manifests to name
the offending rank(s) and parameter(s). Nothing received is ever unpickled.
"""

from __future__ import annotations

import array as _array
import json as _json
import struct as _struct

import numpy as _np
from mpi4py import MPI

from ..errors import InvalidParamError, ManifestMismatchError

__all__ = ["all_equal", "allgather_bytes", "agree", "diagnose", "max_and_min"]

_MAX_ITEMS = 20


def max_and_min(comm, words, call) -> tuple:
    """Return ``(max, min)`` (lists of ints) of int64 ``words`` over all ranks, in one nonblocking
    all-reduce: the words with their bitwise complements, reduced with MAX (``max(~x) == ~min(x)``).

    ``call(request)`` waits for the request (with the caller's deadline). Plain Python: a repeated
    sync runs this with its caches cold, where a numpy call's fixed overhead outweighs the work on
    a few integers (docs/performance.md, History).
    """
    words = [int(w) for w in words]
    n = len(words)
    send = _array.array("q", words + [~w for w in words])
    recv = _array.array("q", bytes(len(send) * 8))
    call(comm.Iallreduce(send, recv, op=MPI.MAX))
    return recv[:n].tolist(), [~w for w in recv[n:]]


def all_equal(comm, words, call) -> tuple:
    """Return ``(max, all ranks equal)`` for int64 ``words``, in one nonblocking all-reduce."""
    high, low = max_and_min(comm, words, call)
    return high, high == low


def allgather_bytes(comm, payload: bytes, call) -> list:
    """Every rank's ``payload``, in rank order (two nonblocking collectives)."""
    lengths = _np.empty(comm.size, dtype=_np.int64)
    call(comm.Iallgather(_np.array([len(payload)], dtype=_np.int64), lengths))
    displs = _np.zeros(comm.size, dtype=_np.int64)
    _np.cumsum(lengths[:-1], out=displs[1:])
    recv = _np.empty(int(lengths.sum()), dtype=_np.uint8)
    send = _np.frombuffer(payload, dtype=_np.uint8)
    call(comm.Iallgatherv(send, [recv, (lengths.tolist(), displs.tolist()), MPI.BYTE]))
    return [recv[d : d + n].tobytes() for d, n in zip(displs.tolist(), lengths.tolist())]


def agree(comm, manifest, call, layout: bytes = bytes(8), fresh: bool = False) -> tuple:
    """Raise the same error on every rank if any rank's manifest is bad or differs; else return
    ``(layouts equal, any fresh)``: whether every rank passed the same 8-byte ``layout`` digest, and
    whether any rank passed ``fresh`` (it prepared its arrays again). One all-reduce, nothing else
    in it.

    ``call(request)`` waits for one request; it enforces the timeout.
    """
    words = [
        1 if manifest.errors else 0,
        *_struct.unpack("=2q", manifest.digest()),
        *_struct.unpack("=q", layout),
        int(fresh),
    ]
    high, low = max_and_min(comm, words, call)
    # no rank's input is bad, and the manifest digests agree
    if high[0] == 0 and high[1:3] == low[1:3]:
        return high[3] == low[3], bool(high[4])
    docs = [_json.loads(raw) for raw in allgather_bytes(comm, manifest.encode(), call)]
    raise diagnose(docs)


def _limited(items: list) -> str:
    shown = "; ".join(items[:_MAX_ITEMS])
    if len(items) > _MAX_ITEMS:
        shown += f"; ... and {len(items) - _MAX_ITEMS} more"
    return shown


def _shape(shape: list) -> str:
    return str(tuple(shape))


def diagnose(docs: list) -> Exception:
    """The error every rank raises, computed identically on every rank from all manifests."""
    invalid = [
        f"rank {rank}: " + (f"parameter {name!r}: {msg}" if name is not None else msg)
        for rank, doc in enumerate(docs)
        for name, msg in doc["errors"]
    ]
    if invalid:
        ranks = sorted({rank for rank, doc in enumerate(docs) if doc["errors"]})
        return InvalidParamError(
            f"mpisync: invalid input on rank(s) {', '.join(map(str, ranks))}: {_limited(invalid)}"
        )
    reference = docs[0]["settings"]
    differing = []
    for key in sorted(set().union(*(d["settings"] for d in docs))):
        values = [d["settings"].get(key) for d in docs]
        if any(v != values[0] for v in values):
            differing.append(
                f"{key}: " + ", ".join(f"rank {r}={v!r}" for r, v in enumerate(values))
            )
    if differing:
        return ManifestMismatchError(
            f"mpisync: ranks disagree on sync settings: {_limited(differing)}"
        )
    root = reference["root"]
    expected = {row[0]: row for row in docs[root]["params"]}
    problems = []  # (rank, text)
    for rank, doc in enumerate(docs):
        if rank == root:
            continue
        mine = {row[0]: row for row in doc["params"]}
        for name in sorted(expected.keys() | mine.keys()):
            if name not in mine:
                problems.append((rank, f"parameter {name!r} is missing (root has it)"))
            elif name not in expected:
                problems.append((rank, f"parameter {name!r} is not on root rank {root}"))
            else:
                _, shape, dtype, count, kind = mine[name]
                _, rshape, rdtype, rcount, rkind = expected[name]
                if kind != rkind:
                    problems.append(
                        (rank, f"parameter {name!r} is in {kind} memory, on root in {rkind} memory")
                    )
                if shape != rshape:
                    problems.append(
                        (
                            rank,
                            f"parameter {name!r} has shape {_shape(shape)}, root has "
                            f"{_shape(rshape)}",
                        )
                    )
                if dtype != rdtype:
                    problems.append(
                        (rank, f"parameter {name!r} has dtype {dtype}, root has {rdtype}")
                    )
                if count != rcount:
                    problems.append(
                        (rank, f"parameter {name!r} has {count} replica(s), root has {rcount}")
                    )
    if not problems:  # a digest collision or a bug: still fail loudly, never hang
        return ManifestMismatchError(
            "mpisync: manifest digests differ between ranks, but no difference was found"
        )
    differing_ranks = ", ".join(str(r) for r in sorted({r for r, _ in problems}))
    return ManifestMismatchError(
        f"mpisync: parameters differ from root rank {root}'s on rank(s) {differing_ranks}: "
        + _limited([f"rank {r}: {text}" for r, text in problems])
    )
