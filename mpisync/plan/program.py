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

from ..params.adapters import _byte_view
from ..params.bulk import BulkManifest
from ..params.fanout import copy_host, replica_copies
from .arena import Arena, copy_list, part_copies
from .spans import span_buffer

__all__ = [
    "Step",
    "compile_program",
    "arena_slots",
    "fused_slots",
    "bucket_pack",
    "bucket_unpack",
    "transfer_buffer",
    "FUSED_SLOTS",
]


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


def arena_slots(plan: list, capacity: int, one_node: bool = True) -> int:
    """How many fusion buffers ``plan`` needs with ``capacity`` collectives in flight."""
    return fused_slots(capacity, sum(1 for t in plan if t.fused), one_node)


def bucket_pack(params: list, pieces: tuple, base: int) -> tuple:
    """Copy groups putting root's masters of a bucket's ``pieces`` into the arena from offset
    ``base``."""
    return copy_list(base, [params[i].master.data for i, _, _, _ in pieces])


def bucket_unpack(params: list, pieces: tuple, base: int, receiving: bool) -> tuple:
    """Copy groups filling, from a bucket at arena offset ``base``, the receivers' masters and every
    rank's other replicas: one run of consecutive pieces per replica index."""
    groups: list = []
    depth = max(len(params[i].replicas) for i, _, _, _ in pieces)
    for r in range(0 if receiving else 1, depth):
        run_offset = 0  # set by the run's first piece
        run: list = []
        for index, _, offset, _ in pieces:
            replicas = params[index].replicas
            if r < len(replicas):
                if not run:
                    run_offset = base + offset
                run.append(replicas[r].data)
            elif run:
                groups.extend(copy_list(run_offset, run))
                run = []
        if run:
            groups.extend(copy_list(run_offset, run))
    return tuple(groups)


def compile_program(
    params: list, plan: list, *, receiving: bool, arena: Arena, fusion_bytes: int
) -> list:
    """The steps that carry out ``plan`` (made for ``params``, host memory) on this rank's replicas.

    ``arena`` holds at least ``slots * fusion_bytes`` bytes.
    """
    slots = len(arena) // fusion_bytes if fusion_bytes else 0
    steps: list[Step]
    fused_steps: list[int]  # the index in ``steps`` of each fused bucket's step
    steps, bucket, fused_steps = [], 0, []
    for transfer in plan:
        label = tuple(params[p[0]].name for p in transfer.pieces)
        if transfer.fused:
            base = (bucket % slots) * fusion_bytes
            view = arena.view[base : base + transfer.nbytes]
            pack = () if receiving else bucket_pack(params, transfer.pieces, base)
            unpack = bucket_unpack(params, transfer.pieces, base, receiving)
            steps.append(
                Step(
                    [view, MPI.BYTE],
                    pack,
                    unpack,
                    (),
                    label,
                    True,
                    arena,
                    fused_steps[bucket - slots] if bucket >= slots else -1,
                )
            )
            fused_steps.append(len(steps) - 1)
            bucket += 1
        else:
            if transfer.run:
                label = tuple(params[i].name for i in transfer.run)
            fan_out = tuple(replica_copies(params, transfer.completes))
            steps.append(
                Step([transfer_buffer(params, transfer), MPI.BYTE], (), (), fan_out, label, False)
            )
    return steps


def transfer_buffer(params: list, transfer):
    """The bytes of direct ``transfer`` on this rank: a slice of one master, or a span of a run."""
    index, start, _, n = transfer.pieces[0]
    if transfer.run:  # parameters end to end in memory: one span from the first one's address
        return span_buffer(params[index].master.data, start, n)
    return params[index].master.data[start : start + n]


def compile_bulk(
    manifest: BulkManifest, plan: list, *, receiving: bool, arena, fusion_bytes: int
) -> list:
    """The :class:`~mpisync.plan.program.Step` list carrying out ``plan`` on ``manifest``'s arrays:
    each
    bucket packed (root) or unpacked (receivers) by one ``BufferList``, large tensors sent in
    place."""
    if getattr(manifest.held, "compiled", False) and not arena.compiled:
        raise ValueError("compile_bulk: C buffer lists need an arena that copies with their loops")
    slots = len(arena) // fusion_bytes if fusion_bytes else 0
    names, values = manifest.names, manifest.values
    steps: list[Step]
    fused_steps: list[int]  # the index in ``steps`` of each fused bucket's step
    steps, bucket, fused_steps = [], 0, []
    for fused, first, last, nbytes in plan:
        if fused:
            base = (bucket % slots) * fusion_bytes
            copies = part_copies(base, manifest.held, first, last)
            steps.append(
                Step(
                    [arena.view[base : base + nbytes], MPI.BYTE],
                    () if receiving else copies,
                    copies if receiving else (),
                    (),
                    tuple(names[first:last]),
                    True,
                    arena,
                    fused_steps[bucket - slots] if bucket >= slots else -1,
                )
            )
            fused_steps.append(len(steps) - 1)
            bucket += 1
        else:
            view = _byte_view(values[first])[last : last + nbytes]
            steps.append(Step([view, MPI.BYTE], (), (), (), (names[first],), False))
    return steps
