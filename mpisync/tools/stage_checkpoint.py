"""``mpisync stage-checkpoint``: copy a checkpoint from root to local disk on every node.

Any file is copied as bytes (nothing is ever loaded or unpickled: a ``.pt``
file travels like any other). Root checks the format only where that catches
a broken file early: a ``.safetensors`` header must describe tensors inside
the file, an ``.npz`` must be a readable zip of ``.npy`` arrays. Root streams
the bytes in chunks through a ring of ``max_concurrent`` buffers (memory:
``max_concurrent x chunk_bytes``) to one writer per node (the ranks sharing
memory with root write nothing but root itself), or to every rank.

Each writer opens DEST's directory and refuses one that another user owns or may write into
without the sticky bit, and a DEST that is a symbolic link
(:mod:`mpisync._runtime.safefiles`); then creates its temporary file exclusively there
(``O_EXCL | O_NOFOLLOW``) with the source's permission bits less write permission for others,
streams into it, fsyncs it and compares a BLAKE2b digest with root's. Only when
every writer succeeded does each rename it over DEST and fsync the directory;
if any rename fails, the writers that renamed roll back (the previous DEST, if
any, is put back) and every rank raises an error that names any node still
holding the new DEST. Root checks that SRC is still the file it opened (inode,
size, modification and change times) once it has streamed it: a save rewriting
it meanwhile would leave every DEST a mix of two versions with a matching
digest, so then no DEST is written. Every local failure (an unreadable or malformed file, a
directory that cannot be written) becomes the same error on every rank.
"""

from __future__ import annotations

import dataclasses as _dc
import hashlib as _hashlib
import json as _json
import os as _os
import socket as _socket
import stat as _stat
import struct as _struct
import time as _time
import zipfile as _zipfile
from collections.abc import Callable

import numpy as _np
from mpi4py import MPI

from .._runtime.observe import timeline_for
from .._runtime.ring import TrackedRing
from .._runtime.safefiles import Folder
from ..errors import InvalidParamError, SyncError
from ..sync import ParamSync

__all__ = ["stage_checkpoint", "StageReport", "check_checkpoint"]

_MAX_MESSAGE = 4096
_HEADER_LIMIT = 100 << 20  # safetensors' own limit on the header


@_dc.dataclass
class StageReport:
    """What one rank did: whether it wrote, where, and the whole transfer's size and time."""

    bytes: int
    seconds: float
    writers: int
    wrote: str | None
    digest: str

    @property
    def gbps(self) -> float:
        """Bytes of the file per second, GB/s."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


def _check_safetensors(path: str, size: int) -> None:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("too short for a safetensors file")
        (header_len,) = _struct.unpack("<Q", head)
        if header_len > min(size - 8, _HEADER_LIMIT):
            raise ValueError(
                f"header length {header_len} does not fit the file ({size} bytes): "
                "not a safetensors file?"
            )
        raw = f.read(header_len)
    try:
        header = _json.loads(raw)
    except RecursionError:
        raise ValueError("the header's JSON nests too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
    data = size - 8 - header_len
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list) and len(offsets) == 2 and all(type(v) is int for v in offsets)
        ):
            raise ValueError(f"tensor {name!r} has no [start, end] data_offsets")
        start, end = offsets
        if not (0 <= start <= end <= data):
            raise ValueError(
                f"tensor {name!r} has offsets {start}..{end} outside the {data} data bytes"
            )


def _check_npz(path: str) -> None:
    with _zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                raise ValueError(f"member {member!r} is not a .npy array")
            with archive.open(member) as f:
                version = _np.lib.format.read_magic(f)
                header = (
                    _np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else _np.lib.format.read_array_header_2_0
                )
                header(f)


def check_checkpoint(path: str) -> int:
    """Check a checkpoint where its format allows (safetensors header, npz members); return its
    size.

    Any other file is accepted as bytes. Nothing is loaded or unpickled.
    """
    try:
        info = _os.stat(path)
        if not _stat.S_ISREG(info.st_mode):
            raise InvalidParamError(f"checkpoint {path!r} is not a regular file")
        kind = path.rsplit(".", 1)[-1].lower()
        if kind == "safetensors":
            _check_safetensors(path, info.st_size)
        elif kind == "npz":
            _check_npz(path)
    except InvalidParamError:
        raise
    except FileNotFoundError:
        raise InvalidParamError(f"checkpoint {path!r} does not exist") from None
    # any failure to read or parse it is this file's problem, told to every rank
    except Exception as exc:
        raise InvalidParamError(f"checkpoint {path!r} refused: {exc}") from None
    return info.st_size


def _encode_status(ok: bool, size: int, mode: int, message: str) -> _np.ndarray:
    raw = message.encode()[:_MAX_MESSAGE]
    head = _struct.pack("<?qiH", ok, size, mode, len(raw))
    return _np.frombuffer(head + raw.ljust(_MAX_MESSAGE, b"\0"), _np.uint8)


_STATUS_HEAD = _struct.calcsize("<?qiH")


def _decode_status(buf: _np.ndarray) -> tuple:
    ok, size, mode, n = _struct.unpack("<?qiH", buf[:_STATUS_HEAD].tobytes())
    return ok, size, mode, buf[_STATUS_HEAD : _STATUS_HEAD + n].tobytes().decode(errors="replace")


def _all_ok(comm, ok: bool, call) -> bool:
    flag = _np.array([1 if ok else 0], dtype=_np.int64)
    out = _np.empty_like(flag)
    call(comm.Iallreduce(flag, out, op=MPI.MIN))
    return bool(out[0])


def _writer_comm(comm, root: int, per_rank: bool) -> tuple:
    """``(writes, writers' communicator or COMM_NULL, node index)``: one writer per node (root on
    its
    own node), or every rank; nodes are numbered from 0 in the order of their lowest rank."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        leaders = comm.Split(0 if node.rank == 0 else MPI.UNDEFINED, key=comm.rank)
        index = _np.array([leaders.rank if leaders != MPI.COMM_NULL else 0], dtype=_np.int64)
        if leaders != MPI.COMM_NULL:
            leaders.Free()
        node.Bcast(index, 0)
        has_root = _np.array([1 if comm.rank == root else 0], dtype=_np.int64)
        node.Allreduce(MPI.IN_PLACE, has_root, op=MPI.MAX)
        writer = per_rank or (comm.rank == root if has_root[0] else node.rank == 0)
    finally:
        node.Free()
    # root is a writer, with the lowest key, so it is rank 0 of the writers' communicator.
    writers = comm.Split(
        0 if writer else MPI.UNDEFINED, key=0 if comm.rank == root else comm.rank + 1
    )
    return writer, writers, int(index[0])


def _destination(template: str, rank: int, node_index: int) -> str:
    return (
        template.replace("{rank}", str(rank))
        .replace("{node}", str(node_index))
        .replace("{host}", _socket.gethostname())
    )


def stage_checkpoint(
    src: str,
    dest: str,
    comm: MPI.Intracomm | None = None,
    *,
    root: int = 0,
    chunk_bytes: int = 64 << 20,
    max_concurrent: int = 4,
    timeout: float | None = None,
    per_rank: bool = False,
    progress: Callable[[int], None] | None = None,
) -> StageReport:
    """Stream ``src`` (read on ``root``) to ``dest`` on every node; every rank returns or raises
    alike.

    ``dest`` may hold ``{rank}`` (the writer's rank in ``comm``), ``{node}``
    (the index of its node: 0 for the node of rank 0, then in the order of each
    node's lowest rank) and ``{host}`` (its host name). ``progress(nbytes)`` is
    called on root as chunks complete. DEST ends up on every writer, with the
    source's permission bits, or on none.
    """
    start = _time.perf_counter()
    timeline = timeline_for(MPI.COMM_WORLD.rank)  # MPISYNC_TIMELINE: one span per staging
    begin = timeline.now() if timeline is not None else 0
    with ParamSync(comm, root=root, max_concurrent=max_concurrent, timeout=timeout) as syncer:

        def exchange(world, call):
            job = _Job(world, call, syncer, src, dest, root, per_rank)
            return job.run(chunk_bytes, max_concurrent, progress)

        size, writers, wrote, digest = syncer._collective_exchange(
            "checkpoint staging", [src], exchange
        )
    if timeline is not None:
        timeline.span("stage-checkpoint", begin, bytes=size, writers=writers)
        timeline.flush()
    return StageReport(size, _time.perf_counter() - start, writers, wrote, digest)


class _Job:
    """One rank's part of a staging: check, prepare, stream, verify, commit (or roll back)."""

    def __init__(self, world, call, syncer, src, dest, root, per_rank):
        self.world, self.call, self.syncer = world, call, syncer
        self.src, self.dest, self.root, self.per_rank = src, dest, root, per_rank
        self.rank = world.rank
        self.writer, self.writers, self.node = False, None, 0
        self.target: str | None = None
        self.folder: Folder | None = None  # DEST's directory, opened and checked
        self.tmp: str | None = None  # names in self.folder
        self.backup: str | None = None
        self.fd = -1
        self.renamed = False  # the new DEST is in place on this rank (a roll-back removes it)
        # a previous DEST was replaced with no backup: a roll-back cannot restore it
        self.unkept = False
        self.source = None
        self.identity: tuple = ()  # root: SRC's (size, times, inode) when it was opened

    def run(self, chunk_bytes, capacity, progress) -> tuple:
        world, call, rank, root = self.world, self.call, self.rank, self.root
        if not (isinstance(root, int) and 0 <= root < world.size):
            raise InvalidParamError(
                f"root={root!r} is not a rank of this communicator (size {world.size})"
            )
        # 1. Root checks the file; everyone learns the verdict (fixed-size status, no pickle).
        status = _np.zeros(_STATUS_HEAD + _MAX_MESSAGE, dtype=_np.uint8)
        if rank == root:
            try:
                size = check_checkpoint(self.src)
                mode = _stat.S_IMODE(_os.stat(self.src).st_mode) & 0o777
                status[:] = _encode_status(True, size, mode, "")
            except Exception as exc:  # every local failure travels in the status
                status[:] = _encode_status(False, 0, 0, str(exc))
        call(world.Ibcast(status, root))
        ok, size, mode, message = _decode_status(status)
        if not ok:
            raise InvalidParamError(f"mpisync: {message}")
        # 2. Everyone is here (the barrier is timed), so the blocking splits cannot hang on a
        # no-show.
        call(world.Ibarrier())
        self.writer, self.writers, self.node = _writer_comm(world, root, self.per_rank)
        n_writers = _np.array([1 if self.writer else 0], dtype=_np.int64)
        try:
            call(world.Iallreduce(MPI.IN_PLACE, n_writers, op=MPI.SUM))
            self._agree(self._local(self._prepare, mode, size), "before streaming")
            digest, failure = b"", ""
            if self.writer:
                # root is rank 0 of the writers' communicator (see _writer_comm)
                digest, failure = _stream(
                    self.writers,
                    call,
                    self.syncer,
                    self.source,
                    size,
                    chunk_bytes,
                    capacity,
                    self.fd,
                    progress,
                    rank,
                )
            if self.fd >= 0 and not failure:
                failure = self._local(_os.fsync, self.fd)
            if self.source is not None and not failure:
                failure = self._local(self._check_unchanged)
            # Root's digest of what it read travels; every writer compares the digest of what it
            # wrote.
            reference = _np.frombuffer(digest.ljust(16, b"\0"), _np.uint8).copy()
            call(world.Ibcast(reference, root))
            if self.writer and not failure and reference.tobytes() != digest:
                failure = f"rank {rank}: digest of the bytes written differs from root's"
            self._agree(failure, "while streaming")
            self._commit()
            return size, int(n_writers[0]), self.target, reference.tobytes().hex()
        finally:
            self._clean_up()

    def _local(self, step, *args) -> str:
        """Run a local step; its failure as a message naming this rank ("" if it succeeded)."""
        try:
            step(*args)
            return ""
        except Exception as exc:
            return (
                f"rank {self.rank} (node {self.node}, {_socket.gethostname()}): "
                f"{type(exc).__name__}: {exc}"
            )

    def _prepare(self, mode: int, size: int) -> None:
        if self.rank == self.root:
            self.source = open(self.src, "rb")
            self.identity = _identity(_os.fstat(self.source.fileno()))
            if self.identity[0] != size:
                raise ValueError(
                    f"SRC changed since it was checked ({size} bytes, now "
                    f"{self.identity[0]}): a save may still be writing it"
                )
        if not self.writer:
            return
        self.target = _destination(self.dest, self.rank, self.node)
        if self.rank == self.root and _os.path.abspath(self.target) == _os.path.abspath(self.src):
            return  # root's copy is the source itself
        # a folder another user may write into, or a DEST that is a symlink: refused here
        self.folder = Folder(self.target)
        self.folder.check_final()
        self.fd, self.tmp = self.folder.temporary(mode)
        _os.fchmod(self.fd, mode & ~0o022)  # the source's bits, but nobody else may change it

    def _check_unchanged(self) -> None:
        """Root: SRC is the file it was when streaming began (inode, size, modification and change
        times, through the open file and through the path); else what was sent may mix two
        versions (a save rewriting it in place), and no DEST may be written."""
        assert self.source is not None  # root, which opened it in _prepare
        now = _identity(_os.fstat(self.source.fileno()))
        try:
            path = _identity(_os.stat(self.src))
        except OSError:
            path = None
        if now != self.identity or path != self.identity:
            raise ValueError(
                f"SRC {self.src!r} changed while it streamed (a save still writing it?): what was "
                "sent may mix two versions; stage it again once it is complete"
            )

    def _agree(self, failure: str, when: str) -> None:
        if not _all_ok(self.world, not failure, self.call):
            raise SyncError(
                f"mpisync: checkpoint staging failed {when}; no DEST was written: "
                + "; ".join(_gather(self.world, failure, self.call))
            )

    def _commit(self) -> None:
        """Rename on every writer, or on none: a writer whose rename failed makes the others roll
        back."""
        failure = ""
        if self.tmp is not None:
            failure = self._local(self._rename)
        if _all_ok(self.world, not failure, self.call):
            if self.backup is not None and self.folder is not None:
                self._local(self.folder.remove, self.backup)
                self.backup = None
            return
        kept = ""
        if self.renamed:
            kept = self._local(self._roll_back)
            if kept:
                kept = f"{kept}; the new DEST {self.target!r} is still there"
            elif self.unkept:
                kept = (
                    f"rank {self.world.rank} (node {self.node}): the previous {self.target!r} "
                    "could not be kept "
                    f"(no hard links here), so it was removed"
                )
        failures, still = (
            _gather(self.world, failure, self.call),
            _gather(self.world, kept, self.call),
        )
        raise SyncError(
            "mpisync: checkpoint staging failed while renaming into place: "
            + "; ".join(failures)
            + (
                "; rolled back on every other writer: no DEST was written"
                if not still
                else "; not everything could be rolled back: " + "; ".join(still)
            )
        )

    def _rename(self) -> None:
        folder = self.folder
        assert folder is not None and self.tmp is not None  # made by _prepare
        folder.check_final()  # still no symlink, folder or other user's file at DEST
        if folder.exists(folder.name):
            # the previous DEST stays reachable for a roll-back (a link fails rather than overwrite)
            try:
                folder.link(folder.name, f"{self.tmp}.previous")
                self.backup = f"{self.tmp}.previous"
            except OSError:  # no hard links here: a roll-back can only remove the new DEST
                self.backup, self.unkept = None, True
        _os.close(self.fd)
        self.fd = -1
        folder.replace(self.tmp)
        self.tmp, self.renamed = None, True
        folder.sync()

    def _roll_back(self) -> None:
        folder = self.folder
        assert folder is not None  # renamed into place
        self.renamed = False
        if self.backup is not None:
            folder.replace(self.backup, folder.name)
            self.backup = None
        else:
            # with self.unkept, the previous DEST goes too (said in the error)
            folder.remove(folder.name)
        folder.sync()

    def _clean_up(self) -> None:
        if self.fd >= 0:
            _os.close(self.fd)
        self.fd = -1
        if self.folder is not None:
            for leftover in (self.tmp, self.backup):
                if leftover is not None:
                    self.folder.remove(leftover)
            self.folder.close()
        if self.source is not None:
            self.source.close()
        if self.writers is not None and self.writers != MPI.COMM_NULL:
            self.writers.Free()


def _identity(info: _os.stat_result) -> tuple:
    """What changes when a file is rewritten, replaced or resized: size, times, inode."""
    return (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino, info.st_dev)


def _gather(world, message: str, call) -> list:
    from ..params.agreement import allgather_bytes

    return [m.decode(errors="replace") for m in allgather_bytes(world, message.encode(), call) if m]


def _stream(comm, call, syncer, source, size, chunk_bytes, capacity, fd, progress, rank) -> tuple:
    """Ibcast ``size`` bytes from rank 0 of ``comm`` (which reads ``source``) in chunks through a
    ring.

    Every rank writes each completed chunk to ``fd`` (if any) and hashes it.
    Returns ``(digest, failure message or "")``.
    """
    hasher = _hashlib.blake2b(digest_size=16)
    chunks = -(-size // chunk_bytes) if size else 0
    slots = [
        _np.empty(min(chunk_bytes, size), dtype=_np.uint8) for _ in range(min(capacity, chunks))
    ]
    ring = TrackedRing(max(1, len(slots)), syncer._settings.timeout.value)
    failure = ""
    for k in range(chunks):
        ring.make_room()  # the slot reused next belongs to a retired chunk
        n = min(chunk_bytes, size - k * chunk_bytes)
        view = slots[k % len(slots)][:n]
        if source is not None:
            try:
                # numpy's stubs declare ndarray's buffer protocol for Python >= 3.12 only
                got = source.readinto(memoryview(view))  # type: ignore[arg-type]
            except OSError as exc:
                got, failure = 0, failure or f"root could not read {size} bytes: {exc}"
            if got != n:
                view[got:] = 0  # keep the collectives matched; the failure is reported at the end
                failure = (
                    failure
                    or f"root could not read byte {k * chunk_bytes + got} (changed while staging?)"
                )

        def done(view=view, n=n):
            nonlocal failure
            hasher.update(view)
            if fd >= 0 and not failure:
                try:
                    written = _os.write(fd, view)
                    while written < n:
                        written += _os.write(fd, view[written:])
                except OSError as exc:
                    failure = f"rank {rank}: write failed: {exc}"
            if progress is not None:
                progress(n)

        ring.push(comm.Ibcast([view, MPI.BYTE], 0), done, ("checkpoint",))
    ring.drain()
    return hasher.digest(), failure
