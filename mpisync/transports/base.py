"""Transports move root's host bytes into every rank's masters, behind one small interface.

A transport is set up once per syncer (``open``, collective), compiles a
program for one prepared parameter set (``compile``, local), runs it within
the sync's deadline (``run``, collective) and frees its buffers (``close``).
:data:`TRANSPORTS` maps the names :mod:`mpisync.transports.selection` chooses to classes:

- ``mpi``: nonblocking broadcasts through the request ring, small tensors
  packed into fusion buckets of an arena;
- ``cross-memory``: tensors copied process to process (:mod:`mpisync.transports.cma`).

The device transport (staged or CUDA-aware) is :mod:`mpisync.transports.device`.
"""

from __future__ import annotations

import abc as _abc
import typing as _typing

from ..params.columns import HostColumns
from ..plan.transfers import bulk_plan

__all__ = ["Transport", "Context", "host_plan", "names_of", "pending_names"]

Source = _typing.TypeVar("Source")
Plan = _typing.TypeVar("Plan")


class Context:
    """What one sync's run needs: the communicator, root, a wait helper, the report and the
    timeline."""

    __slots__ = (
        "comm",
        "root",
        "call",
        "deadline",
        "report",
        "timeline",
        "capacity",
        "one_node",
        "pending",
    )

    def __init__(self, comm, root, deadline, report, timeline, capacity: int, one_node: bool):
        self.comm, self.root, self.deadline, self.call = comm, root, deadline, deadline.wait
        self.report, self.timeline, self.capacity, self.one_node = (
            report,
            timeline,
            capacity,
            one_node,
        )
        # the labels in flight when a wait expires: a callable, set by a transport while it runs
        self.pending: _typing.Callable[[], list] | None = None


def pending_names(expired, ctx: Context | None, everything) -> list:
    """The names a timed-out wait was for: the waiter's own (``expired.pending``: cross-memory's
    copies, the device pipeline), those in flight in the running transport's ring, or
    ``everything``."""
    if getattr(expired, "pending", None) is not None:
        return list(dict.fromkeys(expired.pending))
    if ctx is not None and ctx.pending is not None:
        return [n for label in ctx.pending() for n in label]
    return list(everything)


def host_plan(columns: HostColumns, fusion: int, chunk: int) -> list:
    """The host plan of a parameter set's ``columns``: ``(fused, first, last, nbytes)`` per
    collective (:func:`~mpisync.plan.transfers.bulk_plan`), the same on every rank that agreed on
    the manifest and layout."""
    return bulk_plan(columns.sizes, fusion, chunk)


class Transport(_abc.ABC, _typing.Generic[Source, Plan]):
    """Set up for a syncer, compile per parameter set, run per sync, close once.

    ``Source`` is what a program is compiled over and ``Plan`` which bytes each collective moves:
    a parameter set's :class:`~mpisync.params.columns.HostColumns` and :func:`host_plan` for the
    broadcasts, a :class:`~mpisync.allreduce.reduceset.ReduceSet` and its
    :class:`~mpisync.allreduce.plan.ReducePlan` for the all-reduce
    (:class:`~mpisync.allreduce.transport.ReduceTransport`)."""

    name = ""

    def __init__(self, comm, root: int):
        self.comm, self.root = comm, root
        self.receiving = comm.rank != root

    @property
    def nbytes(self) -> int:
        """Host bytes this transport holds between syncs."""
        return 0

    @_abc.abstractmethod
    def compile(self, columns: Source, plan: Plan, fusion: int, ctx: Context):
        """This rank's program for ``plan`` over ``columns`` (local, no communication, except
        where a transport sets up shared buffers on first use, on every rank alike)."""

    def bind(self, program, ctx: Context) -> None:
        """Exchange what peers need about a fresh program (collective; most transports need
        nothing)."""

    @_abc.abstractmethod
    def run(self, program, ctx: Context) -> None:
        """Move root's bytes (collective); raises :class:`~mpisync._runtime.ring.Expired` past the
        deadline."""

    def close(self, broken: bool = False) -> None:
        """Free the buffers (kept alive for good when ``broken``: collectives may still write)."""


def names_of(label) -> str:
    """The first few names of ``label`` for a log line."""
    return ", ".join(label[:5]) + (f", ... ({len(label)} tensors)" if len(label) > 5 else "")
