"""``mpisync stage-checkpoint``: copy a checkpoint from root to local disk on every node.

Root validates the file (``.safetensors`` or ``.npz``; pickle-based formats are
refused, nothing is unpickled), then streams its bytes in chunks through a
ring of ``max_concurrent`` buffers (memory: ``max_concurrent x chunk_bytes``)
to one writer per node (the ranks sharing memory with root write nothing but
root itself). Writers stream into a temporary file next to ``DEST``, fsync it,
compare a BLAKE2b digest with root's, and rename it into place only when every
rank reports success: a failure anywhere leaves no partial ``DEST``.
"""

from __future__ import annotations

import dataclasses as _dc
import hashlib as _hashlib
import json as _json
import os as _os
import socket as _socket
import struct as _struct
import time as _time
import zipfile as _zipfile

import numpy as _np
from mpi4py import MPI

from .errors import InvalidParamError, SyncError
from .ring import TrackedRing
from .sync import ParamSync

__all__ = ["stage_checkpoint", "StageReport", "check_checkpoint"]

_MAX_MESSAGE = 4096


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
        if header_len > min(size - 8, 100 << 20):
            raise ValueError(f"header length {header_len} does not fit the file ({size} bytes)")
        header = _json.loads(f.read(header_len))
    data = size - 8 - header_len
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        if not (0 <= start <= end <= data):
            raise ValueError(f"tensor {name!r} has offsets {start}..{end} outside the {data} data bytes")


def _check_npz(path: str) -> None:
    with _zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            if not member.endswith(".npy"):
                raise ValueError(f"member {member!r} is not a .npy array")
            with archive.open(member) as f:
                version = _np.lib.format.read_magic(f)
                header = (_np.lib.format.read_array_header_1_0 if version == (1, 0)
                          else _np.lib.format.read_array_header_2_0)
                _, _, dtype = header(f)
            if dtype.hasobject:
                raise ValueError(f"member {member!r} holds Python objects (a pickle); refused")


def check_checkpoint(path: str) -> int:
    """Validate a checkpoint's format without unpickling anything; return its size in bytes."""
    if not _os.path.isfile(path):
        raise InvalidParamError(f"checkpoint {path!r} does not exist or is not a file")
    size = _os.path.getsize(path)
    kind = path.rsplit(".", 1)[-1].lower()
    try:
        if kind == "safetensors":
            _check_safetensors(path, size)
        elif kind == "npz":
            _check_npz(path)
        else:
            raise ValueError("only .safetensors and .npz are staged (pickle-based formats are refused)")
    except (ValueError, KeyError, TypeError, OSError, _zipfile.BadZipFile) as exc:
        raise InvalidParamError(f"checkpoint {path!r} refused: {exc}") from None
    return size


def _encode_status(ok: bool, size: int, message: str) -> _np.ndarray:
    raw = message.encode()[:_MAX_MESSAGE]
    head = _struct.pack("<?qH", ok, size, len(raw))
    return _np.frombuffer(head + raw.ljust(_MAX_MESSAGE, b"\0"), _np.uint8)


def _decode_status(buf: _np.ndarray) -> tuple:
    ok, size, n = _struct.unpack("<?qH", buf[:11].tobytes())
    return ok, size, buf[11:11 + n].tobytes().decode(errors="replace")


def _all_ok(comm, ok: bool, call) -> bool:
    flag = _np.array([1 if ok else 0], dtype=_np.int64)
    out = _np.empty_like(flag)
    call(comm.Iallreduce(flag, out, op=MPI.MIN))
    return bool(out[0])


def _writer_comm(comm, root: int, per_rank: bool):
    """Split off the ranks that write: one per node (root on its own node), or every rank."""
    if per_rank:
        writer = True
    else:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
        has_root = _np.array([1 if comm.rank == root else 0], dtype=_np.int64)
        node.Allreduce(MPI.IN_PLACE, has_root, op=MPI.MAX)
        writer = comm.rank == root if has_root[0] else node.rank == 0
        node.Free()
    # root is a writer, with the lowest key, so it is rank 0 of the writers' communicator.
    return writer, comm.Split(0 if writer else MPI.UNDEFINED, key=0 if comm.rank == root else comm.rank + 1)


def _destination(template: str, rank: int, node_index: int) -> str:
    return template.replace("{rank}", str(rank)).replace("{node}", str(node_index)).replace(
        "{host}", _socket.gethostname())


def stage_checkpoint(src: str, dest: str, comm=None, *, root: int = 0, chunk_bytes: int = 64 << 20,
                     max_concurrent: int = 4, timeout=None, per_rank: bool = False, progress=None) -> StageReport:
    """Stream ``src`` (read on ``root``) to ``dest`` on every node; every rank returns or raises alike.

    ``dest`` may hold ``{rank}``, ``{node}`` (writer index) and ``{host}``.
    ``progress(nbytes)`` is called on root as chunks complete.
    """
    start = _time.perf_counter()
    with ParamSync(comm, root=root, max_concurrent=max_concurrent, timeout=timeout) as syncer:
        def exchange(world, call):
            return _stage(world, call, syncer, src, dest, root, chunk_bytes, max_concurrent, per_rank, progress)
        size, writers, wrote, digest = syncer._collective_exchange("checkpoint staging", [src], exchange)
    return StageReport(size, _time.perf_counter() - start, writers, wrote, digest)


def _stage(world, call, syncer, src, dest, root, chunk_bytes, max_concurrent, per_rank, progress):
    rank = world.rank
    if not (isinstance(root, int) and 0 <= root < world.size):
        raise InvalidParamError(f"root={root!r} is not a rank of this communicator (size {world.size})")
    # 1. Root checks the file; everyone learns the verdict (fixed-size status, no pickle).
    status = _np.zeros(11 + _MAX_MESSAGE, dtype=_np.uint8)
    if rank == root:
        try:
            size = check_checkpoint(src)
            status[:] = _encode_status(True, size, "")
        except InvalidParamError as exc:
            status[:] = _encode_status(False, 0, str(exc))
    call(world.Ibcast(status, root))
    ok, size, message = _decode_status(status)
    if not ok:
        raise InvalidParamError(f"mpisync: {message}")
    # 2. Everyone is here (the barrier is timed), so the blocking splits cannot hang on a no-show.
    call(world.Ibarrier())
    writer, writers = _writer_comm(world, root, per_rank)
    n_writers = _np.array([1 if writer else 0], dtype=_np.int64)
    call(world.Iallreduce(MPI.IN_PLACE, n_writers, op=MPI.SUM))
    target = tmp = handle = None
    failure = ""
    if writer:
        target = _destination(dest, rank, writers.rank)
        same_file = rank == root and _os.path.abspath(target) == _os.path.abspath(src)
        if not same_file:
            tmp = f"{target}.mpisync-tmp-{_os.getpid()}"
            try:
                _os.makedirs(_os.path.dirname(_os.path.abspath(target)), exist_ok=True)
                handle = open(tmp, "wb")
            except OSError as exc:
                failure = f"rank {rank} cannot write {target!r}: {exc}"
    try:
        if not _all_ok(world, not failure, call):
            _raise_first_failure(world, failure, call, "before streaming")
        digest = b""
        if writer:
            # root is rank 0 of the writers' communicator (see _writer_comm)
            digest, failure = _stream(writers, call, syncer, src if rank == root else None, size,
                                      chunk_bytes, max_concurrent, handle, progress, rank)
        if handle is not None:
            handle.flush()
            _os.fsync(handle.fileno())
        # Root's digest of what it read travels; every writer compares the digest of what it wrote.
        reference = _np.frombuffer(digest.ljust(16, b"\0"), _np.uint8).copy()
        call(world.Ibcast(reference, root))
        if writer and not failure and reference.tobytes() != digest:
            failure = f"rank {rank}: digest of the bytes written differs from root's"
        if not _all_ok(world, not failure, call):
            _raise_first_failure(world, failure, call, "while streaming")
        if handle is not None:
            handle.close()
            handle = None
            _os.replace(tmp, target)
            tmp = None
        return size, int(n_writers[0]), target, reference.tobytes().hex()
    finally:
        if handle is not None:
            handle.close()
        if tmp is not None and _os.path.exists(tmp):
            _os.remove(tmp)
        if writers is not None and writers != MPI.COMM_NULL:
            writers.Free()


def _raise_first_failure(world, failure: str, call, when: str) -> None:
    from .agreement import allgather_bytes

    messages = [m.decode() for m in allgather_bytes(world, failure.encode(), call) if m]
    raise SyncError(f"mpisync: checkpoint staging failed {when}; no DEST was written: " + "; ".join(messages))


def _stream(comm, call, syncer, src, size, chunk_bytes, capacity, handle, progress, rank) -> tuple:
    """Ibcast ``size`` bytes from rank 0 of ``comm`` (which reads ``src``) in chunks through a ring.

    Every rank writes each completed chunk to ``handle`` (if any) and hashes it.
    Returns ``(digest, failure message or "")``.
    """
    hasher = _hashlib.blake2b(digest_size=16)
    chunks = -(-size // chunk_bytes) if size else 0
    slots = [_np.empty(min(chunk_bytes, size), dtype=_np.uint8) for _ in range(min(capacity, chunks))]
    ring = TrackedRing(max(1, len(slots)), syncer._settings.timeout.value)
    failure = ""
    source = open(src, "rb") if src is not None else None
    try:
        for k in range(chunks):
            ring.make_room()  # the slot reused next belongs to a retired chunk
            n = min(chunk_bytes, size - k * chunk_bytes)
            view = slots[k % len(slots)][:n]
            if source is not None:
                got = source.readinto(memoryview(view))
                if got != n:
                    view[got:] = 0  # keep the collectives matched; the failure is reported at the end
                    failure = failure or f"root could not read byte {k * chunk_bytes + got} of {src!r} (changed while staging?)"

            def done(view=view, n=n):
                nonlocal failure
                hasher.update(view)
                if handle is not None and not failure:
                    try:
                        handle.write(view)
                    except OSError as exc:
                        failure = f"rank {rank}: write failed: {exc}"
                if progress is not None:
                    progress(n)
            ring.push(comm.Ibcast([view, MPI.BYTE], 0), done, (src or "checkpoint",))
        ring.drain()
    finally:
        if source is not None:
            source.close()
    return hasher.digest(), failure
