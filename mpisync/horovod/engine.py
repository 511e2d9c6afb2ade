"""Horovod's way of running collectives: operations are matched by name, not by calling order.

Each process set has one :class:`Engine`. An operation is *submitted* (``*_async`` returns
then) and runs once every rank of the set has submitted an operation of that name. The ranks
learn that in *rounds* of negotiation (:mod:`mpisync.horovod.progress`: the torch backend's
progress engine runs them, in the background at ``MPI_THREAD_MULTIPLE``): a rank with pending
operations sends their list, each with a short description (kind, dtype, shape, root, op,
splits) as JSON, never pickled, and whether it waits for one. The ranks' lists are gathered,
every name pending on every rank runs in rank 0's order, after its descriptions are compared:
ranks that disagree get the same :class:`HorovodInternalError` on every rank, an argument
refused on any rank the same :class:`HorovodArgumentError`, and nothing moves. When every rank
waits and no name is pending on all of them, the ranks issued different operations: each gets
the same error naming every rank's pending operations, instead of a wait that never ends.

An exception other than an operation's own error (a ``KeyboardInterrupt``, a ``SystemExit`` from a
signal handler) that leaves a run while its transfers may be in flight breaks the engine: the
frames of that run, with every buffer MPI or a peer may still write into, are kept for the rest of
the process, the exception reaches the caller that waited, and every operation of the set, pending
or later, raises the same :class:`HorovodInternalError` (the set's collectives may no longer match
the other ranks'); ``shutdown()`` abandons its communicator instead of freeing it.

A rank inside ``join()`` has no operations; it takes part in the others' all-reduces with
zeros, and the others' other operations fail (Horovod's rule). ``join()`` returns once every
rank has joined, with the rank that joined last.
"""

from __future__ import annotations

import contextlib
import json as _json
import threading as _threading
from collections.abc import Callable
from typing import Any

from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired
from ..params.agreement import merge_ranks
from ..sync import ParamSync
from .errors import HorovodArgumentError, HorovodInternalError
from .guard import RunError, guarded_run
from .progress import Rounds

__all__ = ["Op", "Engine"]


class Op:
    """One submitted operation: its name, its description, and what runs it once matched.

    ``desc`` is ``{"k": kind, "m": what must match on every rank, "s": shapes, "x": extra,
    "e": this rank's argument error or ""}``; ``run(comm, call, descs)`` moves the data
    (``descs``: every rank's description, ``None`` where a rank has joined) and returns the
    result."""

    __slots__ = ("name", "desc", "run", "result", "error", "finished")

    def __init__(self, name: str, desc: dict, run: Callable[..., Any]):
        self.name, self.desc, self.run = name, desc, run
        self.result: Any = None
        self.error: Exception | None = None
        self.finished = _threading.Event()

    @property
    def done(self) -> bool:
        """Whether the operation has finished (its result or error is set)."""
        return self.finished.is_set()

    def finish(self, result: Any = None, error: Exception | None = None) -> None:
        self.result, self.error = result, error
        self.finished.set()


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
    set's communicator in rounds (:class:`~mpisync.horovod.progress.Rounds`, under mpisync's
    timeout). Callers submit and wait on any thread; a round's completion runs on the driver."""

    def __init__(self, comm):
        self.syncer = ParamSync(comm, root=0)
        self._lock = _threading.Lock()  # pending, reserved, joined_at, join_op, waiting
        self.pending: dict[str, Op] = {}  # submitted, not yet run
        self.reserved: set[str] = set()  # names in use: submitted and not yet waited for
        self.counters: dict[str, int] = {}
        self.joined_at = -1  # the round count when this rank joined, or -1
        self.join_op: Op | None = None
        self.negotiations = 0  # rounds posted: the same count on every rank
        self.waiting = 0  # callers of this rank inside wait()
        self.running: Op | None = None  # the operation whose transfers run now
        self.broken = ""  # why the engine is unusable (an interrupted run), or ""
        self._interrupt: BaseException | None = None  # to raise in the caller that waits
        timeout = self.syncer._settings.timeout.value
        self.rounds = Rounds(comm, timeout, self._say, self._settle)

    def close(self) -> None:
        """Stop the rounds and close the syncer; after an interrupted run, the set's
        communicator is abandoned, not freed (requests on it may still be in flight)."""
        self.rounds.close(abandon=bool(self.broken))
        self.syncer.close()

    def auto_name(self, kind: str) -> str:
        """Horovod's name of an unnamed operation: ``kind.noname.N``, counted per kind."""
        count = self.counters.get(kind, 0) + 1
        self.counters[kind] = count
        return f"{kind}.noname.{count}"

    def submit(self, op: Op) -> Op:
        """Queue ``op`` (it may run from now on); a name in use on this rank (submitted, not yet
        waited for) is refused here; so is any operation once the engine is broken."""
        with self._lock:
            if self.broken:
                raise HorovodInternalError(self.broken)
            if op.name in self.reserved:
                raise HorovodArgumentError(
                    f"mpisync.horovod: an operation named {op.name!r} is already in flight on "
                    "this rank (Horovod matches operations by name: names must be unique while "
                    "pending)"
                )
            self.pending[op.name] = op
            self.reserved.add(op.name)
        if self.rounds.threaded:
            self.rounds.kick()
        return op

    def poll(self, op: Op) -> bool:
        """Whether ``op`` is done (never waits)."""
        self._failed_round()
        return op.done

    def wait(self, op: Op) -> Any:
        """Negotiate until ``op`` is done; its result, or its error raised."""
        with self._lock:
            self.waiting += 1
        try:
            while not op.done:
                if self.broken:  # failed since it was submitted (by another thread's run)
                    op.finish(error=HorovodInternalError(self.broken))
                    break
                entry = self.rounds.kick()
                if entry is not None:
                    self.rounds.wait(entry)
                else:  # being finished by the round that ran it, on the driver's thread
                    op.finished.wait(0.001)  # back at once when it is
                self._failed_round()
        finally:
            with self._lock:
                self.waiting -= 1
                self.reserved.discard(op.name)
                interrupt, self._interrupt = self._interrupt, None
        if interrupt is not None:
            raise interrupt  # once, in the caller that waited: the script's own handler
        if op.error is not None:
            raise op.error
        return op.result

    def run(self, op: Op) -> Any:
        """Submit ``op`` and wait for it."""
        return self.wait(self.submit(op))

    def join(self) -> int:
        """Horovod's ``join()``: take part in the others' all-reduces until every rank joined."""
        with self._lock:
            self.joined_at = self.negotiations
            self.join_op = Op("join", {}, lambda *_: None)
        try:
            return self.wait(self.join_op)
        finally:
            with self._lock:
                self.joined_at, self.join_op = -1, None

    def _failed_round(self) -> None:
        """A round that failed (a timeout) fails every pending operation with its error."""
        error = self.rounds.failure()
        if error is not None:
            self._fail_all(error)

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            ops = list(self.pending.values()) + ([self.join_op] if self.join_op else [])
            ops += [self.running] if self.running is not None else []
            self.pending.clear()
            self.running = None
        for op in ops:
            if not op.done:
                op.finish(error=error)  # type: ignore[arg-type]

    def _say(self) -> tuple[bytes, list] | None:
        """This rank's message for the next round, and its pending names (None: nothing)."""
        with self._lock:
            if self.broken or not (self.pending or self.join_op is not None):
                return None
            self.negotiations += 1
            ops = [[n, op.desc] for n, op in self.pending.items()]
            mine = {"o": ops, "j": self.joined_at, "w": self.waiting > 0}
        return _json.dumps(mine).encode(), [n for n, _ in ops]

    def _settle(self, comm, call, messages: list) -> bool:
        """Act on a round's messages; whether anything ran or failed. An exception that is no
        operation's own error (an interrupt) breaks the engine (:meth:`_break`)."""
        try:
            return self._settle_round(comm, call, messages)
        except Expired:
            raise  # the round's timeout, reported by the round
        except BaseException as exc:
            # the round fails with the engine's error, an Exception that the progress engine
            # hands to futures; the interrupt itself goes to the caller that waits
            raise self._break(exc) from exc

    def _break(self, exc: BaseException) -> HorovodInternalError:
        """``exc`` left a run whose requests may be in flight: keep the frames it left (their
        buffers, requests and arrays a peer may still write into by cross-memory) for the rest of
        the process, and fail every operation of this engine, now and later, with the same
        error (returned); ``exc`` itself goes to the caller that waits (:meth:`wait`)."""
        keep_alive(exc.__traceback__)
        what = type(exc).__name__
        message = (
            f"mpisync.horovod: a run of this process set was interrupted ({what}) while its "
            "transfers may have been in flight; the set is "
            "unusable (its collectives may no longer match the other ranks'): call "
            "hvd.shutdown() and hvd.init() on every rank"
        )
        with self._lock:
            self.broken, self._interrupt = message, exc
        self._fail_all(HorovodInternalError(message))
        return HorovodInternalError(message)

    def _settle_round(self, comm, call, messages: list) -> bool:
        parts = [_json.loads(raw) for raw in messages]
        active = [r for r, p in enumerate(parts) if p["j"] < 0]
        if not active:
            last = max(range(len(parts)), key=lambda r: (parts[r]["j"], r))
            if self.join_op is not None:
                self.join_op.finish(last)
            return True
        lists = {r: dict((n, d) for n, d in parts[r]["o"]) for r in active}
        ready = [n for n, _ in parts[active[0]]["o"] if all(n in lists[r] for r in active)]
        if not ready:
            if all(parts[r]["w"] for r in range(len(parts))):
                self._stalled(parts, active, [n for n, _ in parts[comm.rank]["o"]])
                return True
            return False
        for name in ready:
            descs = [lists[r][name] if r in lists else None for r in range(len(parts))]
            self._execute(comm, call, name, descs)
        return True

    def _execute(self, comm, call, name: str, descs: list) -> None:
        kind, message = verdict(name, descs)
        with self._lock:
            op = self.pending.pop(name, None)
        if kind:
            if op is not None:
                error = HorovodArgumentError if kind == "argument" else HorovodInternalError
                op.finish(error=error(f"mpisync.horovod: {message}"))
            return
        if op is None:  # joined: an all-reduce with zeros in place of this rank's tensors
            template = next(d for d in descs if d is not None)
            zeros = Op(name, template, lambda comm, call, _: _zero_allreduce(comm, call, template))
            with contextlib.suppress(RunError):  # the others raise it: this rank has no caller
                guarded_run(zeros, comm, call, descs)
            return
        # a timeout or an interrupt from here on fails it with the pending ones (_fail_all)
        self.running = op
        try:
            result = guarded_run(op, comm, call, descs)
        except Exception as exc:
            if isinstance(exc, Expired):
                raise  # the round's timeout
            self.running = None
            op.finish(error=exc)  # agreed by the guard: the same on every rank
            return
        self.running = None
        op.finish(result)

    def _stalled(self, parts: list, active: list, mine: list) -> None:
        """Every rank waits, and no operation is pending on all: the operations of this rank's
        message (``mine``) and its ``join()`` fail with the same error on every rank."""
        shown = merge_ranks(
            (r, ", ".join(f"{d['k']} {n!r}" for n, d in parts[r]["o"]) or "nothing") for r in active
        )
        error = HorovodInternalError(
            "mpisync.horovod: the ranks wait for different operations, none pending on every "
            "rank: " + "; ".join(shown)
        )
        with self._lock:
            ops = [self.pending.pop(n) for n in mine if n in self.pending]
            ops += [self.join_op] if self.join_op is not None else []
        for op in ops:
            op.finish(error=error)


def _zero_allreduce(comm, call, desc: dict) -> None:
    import torch

    from . import kernels

    op, prescale, postscale = desc["x"]
    # the match ends with dtypes, shapes; the same group as the other ranks': the same buffers
    # and collectives
    zeros = [
        torch.zeros(shape, dtype=getattr(torch, dtype))
        for dtype, shape in zip(desc["m"][-2], desc["s"])
    ]
    if op == "adasum":  # a joined rank takes part with zeros, as in Horovod
        from . import adasum

        adasum.allreduce(comm, call, zeros, prescale, postscale)
        return
    kernels.allreduce(comm, call, zeros, op, prescale, postscale)
