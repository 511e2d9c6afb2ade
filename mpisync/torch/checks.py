"""The argument check: before an operation posts anything, every rank agrees on its arguments.

One nonblocking all-reduce of a few words per operation: a flag (this rank
found a problem with its own arguments), the operation's kind and its signature
(dtypes, element counts, split sizes, reduce op, root), each with its bitwise
complement, reduced with ``MAX`` (``max(~x) == ~min(x)``: the maximum and the
minimum of every word at once, as in :func:`mpisync.params.agreement.max_and_min`).
Only when a flag is up or a word differs do the ranks exchange descriptions of
their arguments (two more collectives), so that every rank raises the same error
naming every rank's arguments; nothing of the operation has been posted then.
Operations whose counts differ by peer (``all_to_all`` with split sizes) then
exchange their counts so that each rank checks what every rank sends it.

The check is opt-in, ``MPISYNC_TORCH_CHECK=1`` (as torch's own collective checks are, behind
``TORCH_DISTRIBUTED_DEBUG=DETAIL``): its all-reduce is a round trip per operation, a cost out of
proportion to a mid-size ``all_reduce`` (``mpisync bench collectives`` shows it side by side).
Without it a local problem raises at once on the rank that has it, and ranks that disagree are
caught by MPI's own checks or by the group's timeout, not by a clear error on every rank.
"""

from __future__ import annotations

import array as _array
import json as _json

import numpy as _np
from mpi4py import MPI

from .._runtime.failfast import mark_everywhere
from ..config import env_switch
from .errors import ArgumentError, MismatchError
from .op import Op, fold, kind_code

__all__ = ["checking", "checked"]

# Signature words compared for every operation (see :func:`_fixed`).
_WIDTH = 6


def checking() -> bool:
    """Whether operations are checked across ranks (``MPISYNC_TORCH_CHECK``, default off)."""
    return env_switch("MPISYNC_TORCH_CHECK", False)


def checked(comm, op: Op, rank: int):
    """``op``'s steps behind the argument check (a generator for the engine)."""
    words = [1 if op.problem else 0, kind_code(op.kind), *_fixed(op.signature)]
    compared = len(words)
    # every operation's last word, reduced with the rest but not compared (the same count of
    # words on every rank, whatever each called): its MAX is 0 when every rank can run in place
    words.append(0 if op.in_place else 1)
    send = _array.array("q", words)
    send.extend([~w for w in words])
    recv = _array.array("q", send)
    yield [comm.Iallreduce(send, recv, MPI.MAX)], False
    reduced = recv.tolist()
    if not _agreed(reduced, len(words), compared):
        raise mark_everywhere((yield from _diagnose(comm, op, rank)), comm)
    op.everywhere = bool(op.in_place) and reduced[compared] == 0
    if op.cross is not None:
        yield from _check_cross(comm, op, rank)
    yield from op.body(comm)


def _fixed(signature) -> list:
    """``signature`` as ``_WIDTH`` words (zeros after it; the words past the last but one folded
    into the last): the check's all-reduce has the same count on every rank, whatever operation
    each called (an operation refused on one rank has no signature)."""
    words = list(signature)
    if len(words) > _WIDTH:
        words[_WIDTH - 1 :] = [fold(words[_WIDTH - 1 :])]
    return words + [0] * (_WIDTH - len(words))


def _agreed(reduced: list, n: int, compared: int) -> bool:
    """Whether no rank flagged a problem and the maximum of each of the first ``compared`` of
    the ``n`` words is its minimum."""
    if reduced[0]:
        return False
    for i in range(1, compared):
        if reduced[i] != ~reduced[n + i]:
            return False
    return True


def _describe(op: Op, rank: int) -> dict:
    return {"rank": rank, "op": op.kind, "args": op.describe(), "problem": op.problem}


def _diagnose(comm, op: Op, rank: int):
    """Every rank's description (two collectives); returns the error all of them raise (its
    message made of the descriptions alone, so it is the same on every rank)."""
    docs = yield from _allgather_json(comm, _describe(op, rank))
    problems = [d for d in docs if d["problem"]]
    if problems:
        lines = "; ".join(f"rank {d['rank']} ({d['op']}): {d['problem']}" for d in problems)
        return ArgumentError(f"mpisync: refused on every rank, nothing was posted: {lines}")
    kinds = sorted({d["op"] for d in docs})
    lines = "; ".join(f"rank {d['rank']}: {d['op']} of {d['args']}" for d in docs)
    return MismatchError(
        f"mpisync: the ranks called {' and '.join(kinds)} with different arguments (operation, "
        f"dtypes, sizes, op or root); every rank raises this, nothing was posted: {lines}"
    )


def _allgather_json(comm, doc: dict):
    payload = _np.frombuffer(_json.dumps(doc).encode(), dtype=_np.uint8)
    lengths = _np.empty(comm.size, dtype=_np.int64)
    yield [comm.Iallgather(_np.array([payload.size], dtype=_np.int64), lengths)], False
    displs = _np.zeros(comm.size, dtype=_np.int64)
    _np.cumsum(lengths[:-1], out=displs[1:])
    gathered = _np.empty(int(lengths.sum()), dtype=_np.uint8)
    counts = (lengths.tolist(), displs.tolist())
    yield [comm.Iallgatherv(payload, [gathered, counts, MPI.BYTE])], False
    return [_json.loads(gathered[d : d + k].tobytes()) for d, k in zip(counts[1], counts[0])]


def _check_cross(comm, op: Op, rank: int):
    """Each rank's counts by peer, gathered: rank ``r`` expects from ``j`` what ``j`` sends it."""
    assert op.cross is not None
    sends, expects = op.cross
    size = comm.size
    mine = _np.array(list(sends) + list(expects), dtype=_np.int64)
    table = _np.empty((size, 2 * size), dtype=_np.int64)
    yield [comm.Iallgather(mine, table)], False
    sent, expected = table[:, :size], table[:, size:]
    wrong = [(r, j) for r in range(size) for j in range(size) if expected[r, j] != sent[j, r]]
    if wrong:
        shown = "; ".join(
            f"rank {r} expects {expected[r, j]} from rank {j}, which sends {sent[j, r]}"
            for r, j in wrong[:10]
        )
        raise mark_everywhere(
            MismatchError(
                f"mpisync: {op.kind}: the ranks' split sizes do not match; every rank raises "
                f"this, nothing was posted: {shown}"
            ),
            comm,
        )
