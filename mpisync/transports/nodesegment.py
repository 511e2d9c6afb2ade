"""Host bytes between ranks of one node through a shared file, with no MPI data movement.

MPI's large-message path between processes (MPICH and Open MPI use CMA,
``process_vm_readv``) pins and copies page by page, so tensors allocated one by
one, mostly on 4 KiB pages, move slower than the same bytes in one flat
``Bcast`` (figures: docs/performance.md). Instead root copies the
plan's transfers, in order, into a ring of ``slots`` slots of a file in
``/dev/shm`` that every rank has mapped, and the other ranks copy them out,
each slot released when every receiver has acked it: one memory copy on each
side, pipelined. Buckets of small tensors are
packed and unpacked with one ``pwritev``/``preadv`` each.

By default (:mod:`mpisync.transports.selection`) it carries parameter sets whose
tensors are all smaller than ``fusion_bytes`` (every byte in fused buckets),
in :data:`SMALL_SLOTS` slots of one bucket, root packing the next bucket
while the others unpack the last; ``MPISYNC_SHARED_MEMORY=1`` puts every set
through it (slots of at least :data:`SLOT_BYTES`), ``0`` never. Why large
sets are not sent this way by default, with the figures: docs/performance.md.

The slot handshake is 64-bit counters in the mapping, each stored with
release order once the slot's bytes are written (or read) and loaded with
acquire order before they are read (or overwritten): C11 atomics of
``mpisync._speedups`` (``store_release``, ``load_acquire``, ``min_acquire``),
so one code path is correct on any memory model (x86-64, aarch64). Where the C
extension is not built or is switched off (``MPISYNC_SPEEDUPS=0``), the slot
ring is not used (:func:`ring_available`), and neither is it when any rank
cannot open the file (ranks on several nodes, another user, no ``/dev/shm``):
every rank keeps MPI. Other users of the mapping (:mod:`.sharedreduce`,
:mod:`mpisync.allreduce.segment`) order their accesses by MPI collectives, not
by these counters.
"""

from __future__ import annotations

import mmap as _mmap
import os as _os
import secrets as _secrets
import time as _time
import typing as _typing

import numpy as _np
from mpi4py import MPI

from .._runtime import failfast as _failfast
from .._runtime.ring import Expired
from .._runtime.speedups import speedups as _speedups
from .._runtime.spin import SLEEP_SECONDS, SPIN_SECONDS
from ..config import switch
from ..params.columns import HostColumns
from ..params.fanout import copy_host
from ..plan.arena import Arena, vectored_io_available
from ..plan.program import bucket_copies

__all__ = [
    "remove_stale_segments",
    "NodeSegment",
    "Chunk",
    "compile_chunks",
    "enabled",
    "available",
    "ring_available",
    "atomics",
    "setting",
    "SLOT_BYTES",
    "SMALL_SLOTS",
]

#: Bytes of one slot for sets with large tensors: one copy on each side per slot, so large enough
#: that the handshake is cheap, small enough that slots stay in cache (docs/performance.md).
SLOT_BYTES = 1 << 20
#: Slots for sets of small tensors only: one fused bucket each; four let root pack ahead while the
#: others unpack (the geometries compared are in docs/performance.md).
SMALL_SLOTS = 4
_LINE = 64  # each counter on its own cache line: no false sharing between ranks
_NAME_BYTES = 96


def setting() -> bool | None:
    """``MPISYNC_SHARED_MEMORY``: True (``1``: any parameter set), False (``0``: never), None
    (unset:
    sets whose tensors are all smaller than ``fusion_bytes``, see the module notes)."""
    return switch("MPISYNC_SHARED_MEMORY")


def enabled(requested: bool | None = None) -> bool:
    """Whether this rank may use the shared segment for every parameter set: asked for
    (``requested``, else ``MPISYNC_SHARED_MEMORY=1``) and possible here."""
    if requested is None:
        requested = setting() is True
    return bool(requested) and available()


def available() -> bool:
    """Whether this platform has what the mapped segment needs (``/dev/shm``, preadv/pwritev)."""
    return vectored_io_available() and _os.path.isdir("/dev/shm")


def atomics():
    """The C extension's ordered counter operations (``load_acquire``, ``store_release``,
    ``min_acquire``), or None where it is not built, is switched off (``MPISYNC_SPEEDUPS=0``) or
    lacks lock-free 64-bit atomics."""
    if _speedups is None or not hasattr(_speedups, "store_release"):
        return None
    return _speedups


def ring_available() -> bool:
    """Whether the slot ring (:meth:`NodeSegment.run`) can run here: the segment
    (:func:`available`) and the ordered counter operations (:func:`atomics`)."""
    return available() and atomics() is not None


_SHM = "/dev/shm"


def _owner_prefix() -> str:
    """``mpisync-<uid>-<pid namespace>-``: a segment file's name starts so, then its creator's pid.
    The namespace makes the pid meaningful: ranks in another PID namespace may share /dev/shm."""
    try:
        namespace = _os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"mpisync-{_os.getuid()}-{namespace}-"


def remove_stale_segments() -> list:
    """Unlink the segment files of this user and PID namespace whose creator has died (a job killed
    while its segment was being set up, before every rank had mapped it); return their paths.

    A live creator's file is left alone, and so is anything not named as this module names its
    files, or owned by another user."""
    prefix = _owner_prefix()
    removed: list[str] = []
    try:
        names = [n for n in _os.listdir(_SHM) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        path = f"{_SHM}/{name}"
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            if _os.lstat(path).st_uid == _os.getuid():
                _os.unlink(path)
                removed.append(path)
        except OSError:  # removed meanwhile (another rank's clean-up)
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        _os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, but not ours to signal
        return True
    return True


def _create(path: str, token: bytes, nbytes: int) -> tuple:
    """``(fd, mapping)`` of a new file of ``nbytes`` at ``path`` (created exclusively, its pages
    reserved), starting with ``token``; nothing left open when it fails (the caller unlinks)."""
    fd = _os.open(path, _os.O_RDWR | _os.O_CREAT | _os.O_EXCL | getattr(_os, "O_CLOEXEC", 0), 0o600)
    try:
        _os.ftruncate(fd, nbytes)
        # Reserve the pages now: a full /dev/shm then fails here (ENOSPC, and every rank keeps
        # MPI) instead of killing a rank with SIGBUS at its first write.
        _os.posix_fallocate(fd, 0, nbytes)
        mapping = _mmap.mmap(fd, nbytes)
    except BaseException:
        _os.close(fd)
        raise
    mapping[:16] = token
    return fd, mapping


def _header_bytes(slots: int, size: int) -> int:
    raw = _LINE * (1 + slots + size)  # token line, one line per slot sequence, one per rank's ack
    return -(-raw // _mmap.PAGESIZE) * _mmap.PAGESIZE


class NodeSegment:
    """The mapped file: slot sequence numbers, per-rank acks, and the slots (an :class:`Arena`)."""

    def __init__(
        self, fd: int, mapping, slots: int, slot_bytes: int, size: int, rank: int, root: int
    ):
        header = _header_bytes(slots, size)
        self.slots, self.slot_bytes, self.rank, self.root = slots, slot_bytes, rank, root
        # The counters, by byte offset in the header: slot k's sequence number at (1 + k) * _LINE,
        # rank r's ack at (1 + slots + r) * _LINE; only ever touched by the ordered operations.
        self._header = memoryview(mapping)[:header]
        self._seq = [(1 + k) * _LINE for k in range(slots)]
        self._ack = [(1 + slots + r) * _LINE for r in range(size)]
        self.arena = Arena.over(fd, mapping, header, slots * slot_bytes)
        self.nbytes = header + slots * slot_bytes
        self._others = [self._ack[r] for r in range(size) if r != root]
        self.size = size
        # root's random token: names it
        self.token = int.from_bytes(bytes(mapping[:8]), "little", signed=True)
        self.next_id = 0  # chunks moved so far; every rank counts the same

    @classmethod
    def open(
        cls, comm, root: int, slots: int, slot_bytes: int, call, requested: bool | None = None
    ) -> NodeSegment | None:
        """Set the segment up on every rank of ``comm``, or return None on every rank.

        Collective (:meth:`open_steps`, each request waited with ``call``)."""
        steps = cls.open_steps(comm, root, slots, slot_bytes, requested)
        try:
            while True:
                requests, _ = next(steps)
                for request in requests:
                    call(request)
        except StopIteration as stop:
            return stop.value
        finally:  # a wait that raised: the file is unlinked now, not when the generator is freed
            steps.close()

    @classmethod
    def open_steps(
        cls, comm, root: int, slots: int, slot_bytes: int, requested: bool | None = None
    ) -> _typing.Generator[tuple[list, bool], None, NodeSegment | None]:
        """The collective steps (two nonblocking collectives, each yielded as ``([request],
        False)``) that set the segment up on every rank of ``comm``; returns it, or None on
        every rank. Root creates and maps the file and sends its name, geometry and a random
        token; the others map it and check the token; the file is unlinked once all have.
        Root's ``slots`` and ``slot_bytes`` are the ones used."""
        size, rank = comm.size, comm.rank
        fd, mapping, path = None, None, None
        geometry = _np.zeros(3, dtype=_np.int64)  # name length, slots, slot bytes
        message = _np.zeros(_NAME_BYTES + 16, dtype=_np.uint8)
        try:
            if rank == root and enabled(requested):
                remove_stale_segments()
                token = _secrets.token_bytes(16)
                path = f"{_SHM}/{_owner_prefix()}{_os.getpid()}-{token[:6].hex()}"
                fd, mapping = _create(path, token, _header_bytes(slots, size) + slots * slot_bytes)
                name = path.encode()
                geometry[:] = (len(name), slots, slot_bytes)
                message[: len(name)] = _np.frombuffer(name, _np.uint8)
                message[_NAME_BYTES:] = _np.frombuffer(token, _np.uint8)
        except Exception:  # noqa: BLE001 - any local failure: every rank learns it below and keeps MPI
            fd, mapping = _close(fd, mapping)
            geometry[0] = 0
        packed = _np.concatenate([geometry.view(_np.uint8), message])
        everyone = _np.zeros(1, dtype=_np.int64)
        try:
            yield [comm.Ibcast(packed, root)], False
            length, slots, slot_bytes = (int(x) for x in packed[:24].view(_np.int64))
            if rank != root and length and enabled(requested):
                try:
                    root_path = packed[24 : 24 + length].tobytes().decode()
                    fd = _os.open(root_path, _os.O_RDWR | getattr(_os, "O_CLOEXEC", 0))
                    nbytes = _header_bytes(slots, size) + slots * slot_bytes
                    if _os.fstat(fd).st_size != nbytes:
                        raise OSError("size differs")
                    mapping = _mmap.mmap(fd, nbytes)
                    # another node's file of that name
                    if mapping[:16] != packed[24 + _NAME_BYTES :].tobytes():
                        raise OSError("token differs")
                except Exception:  # noqa: BLE001 - any local failure: every rank learns it below
                    fd, mapping = _close(fd, mapping)
            ok = _np.array([1 if mapping is not None else 0], dtype=_np.int64)
            yield [comm.Iallreduce(ok, everyone, op=MPI.MIN)], False
        finally:  # also when a wait times out: the mappings keep the file, /dev/shm keeps nothing
            if path is not None:
                try:
                    _os.unlink(path)
                except OSError:  # already removed (a cleaner): the mappings hold the memory
                    pass
        if not everyone[0]:
            _close(fd, mapping)
            return None
        assert fd is not None  # every rank mapped the file
        return cls(fd, mapping, slots, slot_bytes, size, rank, root)

    def run(self, chunks: list, deadline_after, timeline=None, log=None, comm=None) -> None:
        """Move ``chunks`` (this rank's side) through the slots; ``deadline_after()`` gives each
        wait's deadline.

        Raises :class:`~mpisync._runtime.ring.Expired` with ``.pending`` (the waiting
        chunk's names) when a wait outlives its deadline. ``timeline`` gets a
        "pack" (root) or "unpack" span per chunk; ``log(k, chunk)`` is called first. A rank of
        ``comm`` that ended its script ends a wait too (:mod:`mpisync._runtime.failfast`).
        Needs :func:`atomics` (RuntimeError without: :func:`ring_available` said no).
        """
        ordered = atomics()
        if ordered is None:
            raise RuntimeError("the slot ring needs mpisync._speedups' atomics, not built here")
        load, store, least = ordered.load_acquire, ordered.store_release, ordered.min_acquire
        start, slots, header = self.next_id, self.slots, self._header
        arena = self.arena
        root = self.rank == self.root
        others, mine = self._others, self._ack[self.rank]
        for k, chunk in enumerate(chunks):
            if log is not None:
                log(k, chunk)
            seq = self._seq[k % slots]
            if root:
                # Slot k % slots is free once every receiver acked what was there:
                # the chunk slots before this one, or (early in a sync) the last sync's.
                need = start + k - slots + 1 if k >= slots else start
                if least(header, others) < need:
                    _wait(
                        lambda need=need: least(header, others) >= need,
                        deadline_after(),
                        chunk.label,
                        comm,
                    )
                begin = timeline.now() if timeline is not None else 0
                chunk.write(arena)
                store(header, seq, start + k + 1)  # release: after the slot's bytes
                chunk.after_write(arena)
            else:
                ident = start + k + 1
                if load(header, seq) != ident:
                    _wait(
                        lambda s=seq, i=ident: load(header, s) == i,
                        deadline_after(),
                        chunk.label,
                        comm,
                    )
                begin = timeline.now() if timeline is not None else 0
                chunk.read(arena)
                store(header, mine, ident)  # release: after the slot's bytes were read
            if timeline is not None:
                timeline.span(
                    "pack" if root else "unpack",
                    begin,
                    bytes=chunk.nbytes,
                    tensors=len(chunk.label),
                )
        self.next_id = start + len(chunks)


def _close(fd, mapping):
    if mapping is not None:
        mapping.close()
    if fd is not None:
        _os.close(fd)
    return None, None


def _wait(ready, deadline: float | None, label: tuple, comm=None) -> None:
    stall_start = _time.monotonic()
    lookout = _failfast.Lookout(comm)
    while not ready():
        now = _time.monotonic()
        if (deadline is not None and now >= deadline) or lookout.gone(now):
            expired = Expired()
            expired.pending = list(label)
            raise expired
        if now - stall_start < SPIN_SECONDS:
            _os.sched_yield()
        else:
            _time.sleep(SLEEP_SECONDS)


class Chunk:
    """One slot's worth of a plan: a fused bucket (copy lists) or a piece of one transfer
    (bytes)."""

    __slots__ = ("offset", "nbytes", "pack", "unpack", "source", "target", "fan_out", "label")

    def __init__(
        self, offset, nbytes, pack=(), unpack=(), source=None, target=None, fan_out=(), label=()
    ):
        self.offset = offset  # the slot's start in the arena
        self.nbytes = nbytes
        # copy lists (buckets): root's masters in; replicas out
        self.pack, self.unpack = pack, unpack
        # byte views (pieces): root's master / a receiver's
        self.source, self.target = source, target
        # (destination, source) pairs once a direct transfer's last piece is here
        self.fan_out = fan_out
        self.label = label

    def write(self, arena: Arena) -> None:
        """Root: put the bytes into the slot; a bucket with streaming stores (where the C loops are
        built).

        Packed the usual way, a bucket sits in root's cache and every receiver then fetches each
        line from there; streamed, it goes to memory, which every receiver reads at the same cost.
        Large transfers are copied the usual way: streaming them did not pay (the figures:
        docs/performance.md; ``MPISYNC_SHARED_MEMORY=1 mpisync bench`` puts them
        through the segment).
        """
        if self.pack:
            arena.gather(self.pack, streaming=True)
        elif self.source is not None:
            arena.view[self.offset : self.offset + self.source.nbytes] = self.source

    def after_write(self, arena: Arena) -> None:
        """Root: fill its own other replicas (from the slot for buckets, from the master otherwise).

        Receivers run it too, from :meth:`read`: a bucket's copy lists then include the masters.
        """
        if self.unpack:
            arena.scatter(self.unpack)
        copy_host(self.fan_out)

    def read(self, arena: Arena) -> None:
        """Receivers: copy the slot into the master and every other replica."""
        if self.target is not None:
            self.target[:] = arena.view[self.offset : self.offset + self.target.nbytes]
        self.after_write(arena)


def compile_chunks(
    columns: HostColumns, plan: list, *, receiving: bool, slots: int, slot_bytes: int
) -> list:
    """The :class:`Chunk` list carrying out ``plan`` (:func:`~mpisync.plan.transfers.bulk_plan`'s
    tuples over ``columns.sizes``) through a shared segment of ``slots`` slots: buckets copied by
    parts of ``columns.held``, large tensors and spans in pieces; each name's other replicas filled
    once its master holds the bytes."""
    chunks: list[Chunk]
    names, chunks = columns.names, []
    for fused, first, last, nbytes in plan:
        offset = (len(chunks) % slots) * slot_bytes
        if fused:
            copies = bucket_copies(columns, offset, first, last)
            chunks.append(
                Chunk(
                    offset,
                    nbytes,
                    pack=() if receiving else copies,
                    unpack=copies if receiving else (),
                    fan_out=columns.fan_out(range(first, last)),
                    label=tuple(names[first:last]),
                )
            )
            continue
        view = columns.view(first)
        label, end = columns.label(first), last + nbytes
        fan_out = columns.fan_out((first,)) if end == columns.sizes[first] else ()
        for start in range(last, end, slot_bytes):
            piece = view[start : min(start + slot_bytes, end)]
            chunks.append(
                Chunk(
                    (len(chunks) % slots) * slot_bytes,
                    piece.nbytes,
                    source=None if receiving else piece,
                    target=piece if receiving else None,
                    fan_out=fan_out if start + slot_bytes >= end else (),
                    label=label,
                )
            )
    return chunks
