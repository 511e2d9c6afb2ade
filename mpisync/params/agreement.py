"""Agree, across every rank, that a sync may start, or on the one error all ranks raise.

The happy path costs one ``Iallreduce`` of a few integers: a flag for local
errors and the manifest digest, reduced with MAX together with its bitwise
complement (``max(~x) == ~min(x)``), so every rank learns whether min == max.
Only when something differs do ranks exchange their JSON manifests to name
the offending rank(s) and parameter(s). Nothing received is ever unpickled.
"""

from __future__ import annotations

import array as _array
import hashlib as _hashlib
import json as _json
import struct as _struct

import numpy as _np
from mpi4py import MPI

from .._runtime.failfast import mark_everywhere
from ..errors import InvalidParamError, ManifestMismatchError

__all__ = [
    "NO_GRADIENT",
    "all_equal",
    "allgather_bytes",
    "agree",
    "agree_settings",
    "diagnose",
    "max_and_min",
    "merge_ranks",
    "rank_list",
]

_MAX_ITEMS = 20
#: The all-reduce's setting that lists the names it skips for a ``None`` value, sorted.
NO_GRADIENT = "no_gradient"


def max_and_min(comm, words, call) -> tuple:
    """Return ``(max, min)`` (lists of ints) of int64 ``words`` over all ranks, in one nonblocking
    all-reduce: the words with their bitwise complements, reduced with MAX (``max(~x) == ~min(x)``).

    ``call(request)`` waits for the request (with the caller's deadline). Plain Python: a repeated
    sync runs this with its caches cold, where a numpy call's fixed overhead outweighs the work on
    a few integers.
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
    raise mark_everywhere(diagnose(docs), comm)


def agree_settings(comm, settings: dict, call, error=ManifestMismatchError) -> None:
    """Raise ``error`` on every rank of ``comm`` unless every rank passed equal ``settings`` (a
    JSON-safe dict): one all-reduce of a digest, and only on a difference the settings
    themselves, to name each differing setting and the ranks of each value."""
    encoded = _json.dumps(settings, sort_keys=True).encode()
    digest = _hashlib.blake2b(encoded, digest_size=16).digest()
    _, equal = all_equal(comm, _struct.unpack("=2q", digest), call)
    if equal:
        return
    docs = [{"settings": _json.loads(raw)} for raw in allgather_bytes(comm, encoded, call)]
    raise error(
        "mpisync: ranks disagree on settings that change what travels or how it is checked "
        f"(each must be the same on every rank): {_limited(_settings_differences(docs))}"
    )


def rank_list(ranks) -> str:
    """Ranks in order, runs of three or more as ranges: ``0, 2, 4-63``."""
    ranks = sorted(set(ranks))
    parts, start = [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            run = ranks[start:i]
            parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(r) for r in run]
            start = i
    return ", ".join(parts)


def merge_ranks(pairs) -> list:
    """``(rank, text)`` pairs as lines, each text once with every rank that has it:
    ``rank 3: text``, ``ranks 0-63: text`` (in the order texts first appear)."""
    by_text: dict = {}
    for rank, text in pairs:
        by_text.setdefault(text, []).append(rank)
    return [
        f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {rank_list(ranks)}: {text}"
        for text, ranks in by_text.items()
    ]


def _limited(items: list) -> str:
    shown = "; ".join(items[:_MAX_ITEMS])
    if len(items) > _MAX_ITEMS:
        shown += f"; ... and {len(items) - _MAX_ITEMS} more"
    return shown


def _shape(shape: list) -> str:
    return str(tuple(shape))


def _settings_differences(docs: list) -> list:
    """One line per sync setting the ranks disagree on: ``key: rank 0=1, ranks 1-3=2``."""
    differing = []
    for key in sorted(set().union(*(d["settings"] for d in docs))):
        by_value: dict = {}
        for rank, doc in enumerate(docs):
            by_value.setdefault(repr(doc["settings"].get(key)), []).append(rank)
        if len(by_value) > 1:
            differing.append(
                f"{key}: "
                + ", ".join(
                    f"{'rank' if len(r) == 1 else 'ranks'} {rank_list(r)}={v}"
                    for v, r in by_value.items()
                )
            )
    return differing


def _row_differences(name: str, row: list, root_row: list) -> list:
    """How one parameter's manifest row differs from root's."""
    _, shape, dtype, count, kind = row
    _, rshape, rdtype, rcount, rkind = root_row
    found = []
    if kind != rkind:
        found.append(f"parameter {name!r} is in {kind} memory, on root in {rkind} memory")
    if shape != rshape:
        found.append(f"parameter {name!r} has shape {_shape(shape)}, root has {_shape(rshape)}")
    if dtype != rdtype:
        found.append(f"parameter {name!r} has dtype {dtype}, root has {rdtype}")
    if count != rcount:
        found.append(f"parameter {name!r} has {count} replica(s), root has {rcount}")
    return found


def _param_differences(docs: list, root: int) -> list:
    """``(rank, text)`` for every parameter of a rank that differs from root's."""
    expected = {row[0]: row for row in docs[root]["params"]}
    problems = []
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
                problems += [(rank, t) for t in _row_differences(name, mine[name], expected[name])]
    return problems


def _none_differences(docs: list) -> list:
    """One text per name that is ``None`` on some ranks (:data:`NO_GRADIENT`) but not on all."""
    nones = [set(doc["settings"].get(NO_GRADIENT) or ()) for doc in docs]
    found = []
    for name in sorted(set().union(*nones)):
        none = [rank for rank, names in enumerate(nones) if name in names]
        if len(none) == len(docs):
            continue
        held = [r for r, doc in enumerate(docs) if any(row[0] == name for row in doc["params"])]
        other = [r for r in range(len(docs)) if r not in none and r not in held]
        text = f"{name!r} is None on rank(s) {rank_list(none)}"
        text += f", an array on rank(s) {rank_list(held)}" if held else ""
        text += f", absent on rank(s) {rank_list(other)}" if other else ""
        found.append(text)
    return found


def diagnose(docs: list) -> Exception:
    """The error every rank raises, computed identically on every rank from all manifests.

    A text that several ranks share is one line naming them all (``ranks 1-63: ...``)."""
    invalid = merge_ranks(
        (rank, f"parameter {name!r}: {msg}" if name is not None else msg)
        for rank, doc in enumerate(docs)
        for name, msg in doc["errors"]
    )
    if invalid:
        ranks = [rank for rank, doc in enumerate(docs) if doc["errors"]]
        return InvalidParamError(
            f"mpisync: invalid input on rank(s) {rank_list(ranks)}: {_limited(invalid)}"
        )
    missing = _none_differences(docs)
    if missing:
        return ManifestMismatchError(
            "mpisync: a gradient is None on some ranks and an array on others: "
            f"{_limited(missing)}; a None value is skipped only where it is None on every rank: "
            "pass zeros where a rank has no gradient (torch.zeros_like(p)), as "
            "mpisync.horovod.DistributedOptimizer does"
        )
    differing = _settings_differences(docs)
    if differing:
        return ManifestMismatchError(
            f"mpisync: ranks disagree on sync settings: {_limited(differing)}"
        )
    root = docs[0]["settings"]["root"]
    problems = _param_differences(docs, root)
    if not problems:  # a digest collision or a bug: still fail loudly, never hang
        return ManifestMismatchError(
            "mpisync: manifest digests differ between ranks, but no difference was found"
        )
    return ManifestMismatchError(
        f"mpisync: parameters differ from root rank {root}'s on rank(s) "
        f"{rank_list(r for r, _ in problems)}: " + _limited(merge_ranks(problems))
    )
