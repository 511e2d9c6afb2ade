"""Horovod's way of running collectives: operations are matched by name, not by calling order.

Each process set has one :class:`Engine`. An operation is *submitted* (``*_async`` returns
then) and runs once every rank of the set has submitted an operation of that name. The ranks
learn that in a *negotiation*: each rank's waiting call (``synchronize``, a blocking operation,
``join``) sends the list of its pending operations, each with a short description (kind, dtype,
shape, root, op, splits) as JSON, never pickled. The ranks' lists are gathered, every name
pending on every rank runs in rank 0's order, after its descriptions are compared: ranks that
disagree get the same :class:`HorovodInternalError` on every rank, an argument refused on any
rank the same :class:`HorovodArgumentError`, and nothing moves. When every rank waits and no
name is pending on all of them, the ranks issued different operations: each gets the same
error naming every rank's pending operations, instead of a wait that never ends.

A rank inside ``join()`` has no operations; it takes part in the others' all-reduces with
zeros, and the others' other operations fail (Horovod's rule). ``join()`` returns once every
rank has joined, with the rank that joined last.
"""

from __future__ import annotations

import json as _json
from collections.abc import Callable
from typing import Any

from ..params.agreement import allgather_bytes, merge_ranks
from ..sync import ParamSync
from .errors import HorovodArgumentError, HorovodInternalError

__all__ = ["Op", "Engine"]


class Op:
    """One submitted operation: its name, its description, and what runs it once matched.

    ``desc`` is ``{"k": kind, "m": what must match on every rank, "s": shapes, "x": extra,
    "e": this rank's argument error or ""}``; ``run(comm, call, descs)`` moves the data
    (``descs``: every rank's description, ``None`` where a rank has joined) and returns the
    result."""

    __slots__ = ("name", "desc", "run", "result", "error", "done")

    def __init__(self, name: str, desc: dict, run: Callable[..., Any]):
        self.name, self.desc, self.run = name, desc, run
        self.result: Any = None
        self.error: Exception | None = None
        self.done = False

    def finish(self, result: Any = None, error: Exception | None = None) -> None:
        self.result, self.error, self.done = result, error, True


def _shown(desc: dict | None) -> str:
    if desc is None:
        return "joined"
    return f"{desc['k']} {desc['m']}"


def verdict(name: str, descs: list) -> tuple[str, str]:
    """``(kind of error, message)`` for the operation ``name`` described by every rank
    (``("", "")``: it runs). The same on every rank: it reads only what all ranks have."""
    live = [(r, d) for r, d in enumerate(descs) if d is not None]
    errors = [(r, d["e"]) for r, d in live if d["e"]]
    if errors:
        return "argument", f"{name!r}: " + "; ".join(merge_ranks(errors))
    if len({_json.dumps([d["k"], d["m"]]) for _, d in live}) > 1:
        shown = merge_ranks((r, _shown(d)) for r, d in live)
        return "mismatch", f"ranks disagree about operation {name!r}: " + "; ".join(shown)
    joined = [r for r, d in enumerate(descs) if d is None]
    if joined and live[0][1]["k"] != "allreduce":
        return "mismatch", (
            f"{live[0][1]['k']} {name!r}: rank(s) {', '.join(map(str, joined))} have called "
            "join(); only allreduce runs with joined ranks"
        )
    return "", ""


class Engine:
    """The pending operations of one process set on this rank, and their negotiation over the
    set's communicator (``syncer``'s, under mpisync's timeout)."""

    def __init__(self, comm):
        self.syncer = ParamSync(comm, root=0)
        self.pending: dict[str, Op] = {}
        self.counters: dict[str, int] = {}
        self.joined_at = -1  # the negotiation count when this rank joined, or -1
        self.join_op: Op | None = None
        self.negotiations = 0

    def close(self) -> None:
        self.syncer.close()

    def auto_name(self, kind: str) -> str:
        """Horovod's name of an unnamed operation: ``kind.noname.N``, counted per kind."""
        count = self.counters.get(kind, 0) + 1
        self.counters[kind] = count
        return f"{kind}.noname.{count}"

    def submit(self, op: Op) -> Op:
        """Queue ``op``; a name already pending on this rank is refused here."""
        if op.name in self.pending:
            raise HorovodArgumentError(
                f"mpisync.horovod: an operation named {op.name!r} is already in flight on this "
                "rank (Horovod matches operations by name: names must be unique while pending)"
            )
        self.pending[op.name] = op
        return op

    def wait(self, op: Op) -> Any:
        """Negotiate until ``op`` is done; its result, or its error raised."""
        while not op.done:
            self.negotiations += 1
            self.syncer._collective_exchange(
                "Horovod negotiation", list(self.pending), self._negotiate
            )
        if op.error is not None:
            raise op.error
        return op.result

    def run(self, op: Op) -> Any:
        """Submit ``op`` and wait for it."""
        return self.wait(self.submit(op))

    def join(self) -> int:
        """Horovod's ``join()``: take part in the others' all-reduces until every rank joined."""
        self.joined_at = self.negotiations
        self.join_op = Op("join", {}, lambda *_: None)
        try:
            return self.wait(self.join_op)
        finally:
            self.joined_at, self.join_op = -1, None

    def _negotiate(self, comm, call) -> None:
        mine = {"o": [[n, op.desc] for n, op in self.pending.items()], "j": self.joined_at}
        parts = [
            _json.loads(raw) for raw in allgather_bytes(comm, _json.dumps(mine).encode(), call)
        ]
        active = [r for r, p in enumerate(parts) if p["j"] < 0]
        if not active:
            last = max(range(len(parts)), key=lambda r: (parts[r]["j"], r))
            if self.join_op is not None:
                self.join_op.finish(last)
            return
        lists = {r: dict((n, d) for n, d in parts[r]["o"]) for r in active}
        ready = [n for n, _ in parts[active[0]]["o"] if all(n in lists[r] for r in active)]
        if not ready:
            self._stalled(parts, active)
            return
        for name in ready:
            descs = [lists[r][name] if r in lists else None for r in range(len(parts))]
            self._execute(comm, call, name, descs)

    def _execute(self, comm, call, name: str, descs: list) -> None:
        kind, message = verdict(name, descs)
        op = self.pending.pop(name, None)
        if kind:
            if op is not None:
                error = HorovodArgumentError if kind == "argument" else HorovodInternalError
                op.finish(error=error(f"mpisync.horovod: {message}"))
            return
        if op is None:  # joined: an all-reduce with zeros in place of this rank's tensors
            template = next(d for d in descs if d is not None)
            _zero_allreduce(comm, call, template)
            return
        op.finish(op.run(comm, call, descs))

    def _stalled(self, parts: list, active: list) -> None:
        shown = merge_ranks(
            (r, ", ".join(f"{d['k']} {n!r}" for n, d in parts[r]["o"]) or "nothing") for r in active
        )
        error = HorovodInternalError(
            "mpisync.horovod: the ranks wait for different operations, none pending on every "
            "rank: " + "; ".join(shown)
        )
        for op in self.pending.values():
            op.finish(error=error)
        self.pending.clear()
        if self.join_op is not None:
            self.join_op.finish(error=error)


def _zero_allreduce(comm, call, desc: dict) -> None:
    import torch

    from . import kernels

    op, prescale, postscale = desc["x"]
    for dtype, shape in zip(desc["m"][-2], desc["s"]):  # the match ends with dtypes, shapes
        zeros = torch.zeros(shape, dtype=getattr(torch, dtype))
        kernels.allreduce(comm, call, zeros, op, prescale, postscale)
