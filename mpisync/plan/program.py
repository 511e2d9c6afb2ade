"""A broadcast plan bound to one rank's arrays: the exact copies and collectives to run.

Compiling once and keeping the result lets repeated syncs of the same arrays
skip all per-tensor Python work except the copies themselves. Fusion buffers
are slots of one arena: bucket ``j`` uses slot ``j % slots``, and its step
names the step of bucket ``j - slots`` (:attr:`Step.after`), which the
broadcast retires (completed and unpacked) before it packs or posts bucket
``j`` into the same slot.
"""

from __future__ import annotations

import dataclasses as _dc

from mpi4py import MPI

from ..params.columns import HostColumns
from ..params.fanout import copy_host
from .arena import Arena, check_copier, copy_list, part_copies

__all__ = ["Step", "bucket_copies", "compile_program", "fused_slots", "FUSED_SLOTS"]


@_dc.dataclass
class Step:
    """One collective with the copies around it.

    ``pack`` and ``unpack`` are :func:`~mpisync.plan.arena.copy_list` groups between
    ``arena`` and parameter buffers (fused buckets only); ``fan_out`` holds
    ``(destination, source)`` memoryview pairs for direct transfers.
    """

    buffer: list  # [memoryview, MPI.BYTE], as Ibcast takes it
    pack: tuple  # root only, before posting: masters into the arena
    unpack: tuple  # after completion: arena into receivers' masters and every rank's other replicas
    # every rank, after completion: master -> other local replicas (direct transfers)
    fan_out: tuple
    label: tuple  # parameter names, for timeout diagnostics
    fused: bool
    arena: Arena | None = None
    # the step that used this bucket's arena slot before it (retired first); -1: none
    after: int = -1

    # Only fused steps pack or unpack, and they have an arena: the union-attr ignores below.

    def start(self, timeline=None) -> None:
        """Run before the collective is posted: pack root's masters (span on ``timeline``)."""
        if self.pack:
            begin = timeline.now() if timeline is not None else 0
            self.arena.gather(self.pack)  # type: ignore[union-attr]
            if timeline is not None:
                timeline.span("pack", begin, tensors=len(self.label))

    def finish(self, timeline=None) -> None:
        """Run after the collective completed: unpack, then the local fan-out (spans on
        ``timeline``)."""
        if self.unpack:
            begin = timeline.now() if timeline is not None else 0
            self.arena.scatter(self.unpack)  # type: ignore[union-attr]
            if timeline is not None:
                timeline.span(
                    "unpack",
                    begin,
                    buffers=sum(
                        len(group if held is None else held) for _, group, _, held in self.unpack
                    ),
                )
        if self.fan_out:
            begin = timeline.now() if timeline is not None else 0
            copy_host(self.fan_out)
            if timeline is not None:
                timeline.span("fan-out", begin, copies=len(self.fan_out))


#: Fusion buffers a plan takes turns in, however many collectives are in flight, where every rank
#: is on one node. There the copies, not the wire, set the pace, and with two slots they stay in
#: the caches from one bucket to the next (against one slot, and one per collective in flight:
#: docs/performance.md); two let a bucket be packed while the last one moves. Across nodes each
#: collective in flight keeps a slot of its own: a broadcast tree's stages and the network's
#: latency want many buckets in flight.
FUSED_SLOTS = 2


def fused_slots(capacity: int, fused: int, one_node: bool) -> int:
    """How many fusion buffers ``fused`` buckets take turns in with ``capacity`` collectives in
    flight: at most :data:`FUSED_SLOTS` where every rank is on one node (``one_node``)."""
    return min(capacity, FUSED_SLOTS if one_node else capacity, fused)


def bucket_copies(columns: HostColumns, offset: int, first: int, last: int) -> tuple:
    """Copy groups laying the masters of bucket ``first:last`` end to end in the arena from
    ``offset``: a part of the set's one buffer list where it has one, else copy lists of their
    own."""
    if columns.held is not None:
        return part_copies(offset, columns.held, first, last)
    return copy_list(offset, columns.masters(first, last))


def compile_program(
    columns: HostColumns, plan: list, *, receiving: bool, arena, fusion_bytes: int
) -> list:
    """The :class:`Step` list carrying out ``plan`` (:func:`~mpisync.plan.transfers.bulk_plan`'s
    tuples over ``columns.sizes``) on this rank's masters: each bucket packed (root) or unpacked
    (receivers) by a part of ``columns.held``, large tensors and spans sent in place; then each
    name's other replicas filled from its master.

    ``arena`` holds at least ``slots * fusion_bytes`` bytes.
    """
    check_copier(columns.held, arena, "compile_program")
    slots = len(arena) // fusion_bytes if fusion_bytes else 0
    names = columns.names
    steps: list[Step]
    fused_steps: list[int]  # the index in ``steps`` of each fused bucket's step
    steps, bucket, fused_steps = [], 0, []
    for fused, first, last, nbytes in plan:
        if fused:
            base = (bucket % slots) * fusion_bytes
            copies = bucket_copies(columns, base, first, last)
            steps.append(
                Step(
                    [arena.view[base : base + nbytes], MPI.BYTE],
                    () if receiving else copies,
                    copies if receiving else (),
                    columns.fan_out(range(first, last)),
                    tuple(names[first:last]),
                    True,
                    arena,
                    fused_steps[bucket - slots] if bucket >= slots else -1,
                )
            )
            fused_steps.append(len(steps) - 1)
            bucket += 1
        else:
            view = columns.view(first)[last : last + nbytes]
            done = last + nbytes == columns.sizes[first]  # the transfer's last chunk
            fan_out = columns.fan_out((first,)) if done else ()
            steps.append(Step([view, MPI.BYTE], (), (), fan_out, columns.label(first), False))
    return steps
