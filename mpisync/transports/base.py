"""Transports move root's host bytes into every rank's masters, behind one small interface.

A transport is set up once per syncer (``open``, collective), compiles a
program for one prepared parameter set (``compile``, local), runs it within
the sync's deadline (``run``, collective) and frees its buffers (``close``).
:data:`TRANSPORTS` maps the names :mod:`mpisync.transports.selection` chooses to classes:

- ``mpi``: nonblocking broadcasts through the request ring, small tensors
  packed into fusion buckets of an arena;
- ``cross-memory``: tensors copied process to process (:mod:`mpisync.transports.cma`);
- ``shared memory``: a ring of slots in a file every rank maps
(:mod:`mpisync.transports.nodesegment`).

The device transport (staged or CUDA-aware) is :mod:`mpisync.transports.device`.
"""

from __future__ import annotations

import abc as _abc
import typing as _typing

from ..params.columns import HostColumns
from ..plan.transfers import bulk_plan

__all__ = ["Transport", "Context", "host_plan", "names_of"]


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
        # names in flight when a wait expires: a callable, set by the running transport
        self.pending: _typing.Callable[[], list] | None = None


def host_plan(columns: HostColumns, fusion: int, chunk: int) -> list:
    """The host plan of a parameter set's ``columns``: ``(fused, first, last, nbytes)`` per
    collective (:func:`~mpisync.plan.transfers.bulk_plan`), the same on every rank that agreed on
    the manifest and layout."""
    return bulk_plan(columns.sizes, fusion, chunk)


class Transport(_abc.ABC):
    """Set up for a syncer, compile per parameter set, run per sync, close once."""

    name = ""

    def __init__(self, comm, root: int):
        self.comm, self.root = comm, root
        self.receiving = comm.rank != root

    @property
    def nbytes(self) -> int:
        """Host bytes this transport holds between syncs."""
        return 0

    @_abc.abstractmethod
    def compile(self, columns: HostColumns, plan: list, fusion: int, ctx: Context):
        """This rank's program for ``plan`` over a parameter set's host ``columns`` (local, no
        communication)."""

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
