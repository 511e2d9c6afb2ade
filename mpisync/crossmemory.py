"""Large host tensors between the ranks of one node by cross-memory attach, both sides copying.

MPI's single-copy path between processes (CMA, ``process_vm_readv``) is run by
the receiver alone; on memory in 4 KiB pages (tensors allocated one by one) it
pins and copies page by page at about half the speed it reaches on the huge
pages of one large allocation. Here root writes the first share of every
receiver's bytes (``process_vm_writev``) while each receiver reads the rest
(``process_vm_readv``), straight from tensor to tensor: two cores share the
work. At 2 ranks here a repeated sync of ResNet-50's parameters ran at
0.8-1.0 of one flat ``Bcast`` of the same bytes this way, against 0.5-0.6
through MPI. Fused buckets of small tensors still travel by MPI.

Writing into another process needs care, so: a rank copies to or from a peer
only after reading back, at the address that peer published, the random token
it published (a pid from another PID namespace or node is never written to);
addresses are exchanged again whenever any rank rebuilt its steps, and the
compiled steps hold the arrays, so their memory does not move in between; a
failed or short copy on any rank makes every rank redo those transfers through
MPI in the same sync (see :mod:`mpisync.sync`) and keep MPI afterwards.
"""

from __future__ import annotations

import ctypes as _ctypes
import hashlib as _hashlib
import os as _os
import secrets as _secrets
import sys as _sys

import numpy as _np
from mpi4py import MPI

__all__ = ["CrossMemory", "enabled"]

_BATCH = 1024  # IOV_MAX on Linux: the most iovecs one call takes on either side


class _Iovec(_ctypes.Structure):
    _fields_ = [("base", _ctypes.c_void_p), ("len", _ctypes.c_size_t)]


def _bind():
    if not _sys.platform.startswith("linux"):
        return None
    try:
        libc = _ctypes.CDLL(None, use_errno=True)
        calls = (libc.process_vm_readv, libc.process_vm_writev)
    except (OSError, AttributeError):
        return None
    for call in calls:
        call.restype = _ctypes.c_ssize_t
        call.argtypes = [_ctypes.c_int, _ctypes.c_void_p, _ctypes.c_ulong, _ctypes.c_void_p, _ctypes.c_ulong,
                         _ctypes.c_ulong]
    return calls


_CALLS = _bind()


def enabled(requested: bool | None = None) -> bool:
    """Whether this rank may use cross-memory copies: asked for (``requested``, else
    ``MPISYNC_CROSS_MEMORY``, on unless 0) and offered by the OS (Linux)."""
    if requested is None:
        requested = _os.environ.get("MPISYNC_CROSS_MEMORY", "1").strip().lower() not in ("0", "false", "no", "off")
    return bool(requested) and _CALLS is not None


def _batches(call, pid: int, pairs: list) -> list:
    """``(call, pid, local iovecs, remote iovecs, count, bytes)`` for ``(local, remote, nbytes)`` pairs."""
    out = []
    for start in range(0, len(pairs), _BATCH):
        group = pairs[start:start + _BATCH]
        local = (_Iovec * len(group))(*[(a, n) for a, _, n in group])
        remote = (_Iovec * len(group))(*[(b, n) for _, b, n in group])
        out.append((call, pid, local, remote, len(group), sum(n for _, _, n in group)))
    return out


def _byte_range(local: _np.ndarray, remote: _np.ndarray, start: int, stop: int) -> list:
    """``(local address, remote address, nbytes)`` covering bytes ``[start, stop)`` of the pieces laid end
    to end; ``local``/``remote`` are ``(k, 2)`` tables of ``(address, nbytes)``."""
    pairs, offset = [], 0
    for (here, nbytes), (there, _) in zip(local.tolist(), remote.tolist()):
        lo, hi = max(start, offset), min(stop, offset + nbytes)
        if lo < hi:
            pairs.append((here + lo - offset, there + lo - offset, hi - lo))
        offset += nbytes
    return pairs


class CrossMemory:
    """Every rank's pid, checked reachable by a token read; :meth:`bind` compiles one rank's copies."""

    def __init__(self, pids: list, rank: int, root: int):
        self.pids, self.rank, self.root = pids, rank, root

    @classmethod
    def open(cls, comm, root: int, call, requested: bool | None = None) -> CrossMemory | None:
        """Check on every rank of ``comm`` that root and every other rank can reach each other; the
        object, or None on every rank. Collective (an all-gather and an all-reduce, waited with ``call``)."""
        rank, size = comm.rank, comm.size
        mine = enabled(requested)
        token = _np.frombuffer(_secrets.token_bytes(16), dtype=_np.int64).copy()  # peers read this array
        host = _np.frombuffer(_hashlib.blake2b(MPI.Get_processor_name().encode(), digest_size=8).digest(),
                              dtype=_np.int64)[0]
        row = _np.array([_os.getpid() if mine else 0, token.ctypes.data, token[0], token[1], host],
                        dtype=_np.int64)
        table = _np.empty((size, 5), dtype=_np.int64)
        call(comm.Iallgather(row, table))
        # One node only (as MPI names them): on several, some pairs could not reach each other.
        ok = bool(table[:, 0].all()) and bool((table[:, 4] == host).all())
        peers = [r for r in range(size) if r != rank] if rank == root else [root]
        probe = _np.zeros(2, dtype=_np.int64)
        for peer in peers if ok else ():
            probe[:] = 0
            pairs = [(probe.ctypes.data, int(table[peer, 1]), 16)]
            for read, pid, local, remote, count, nbytes in _batches(_CALLS[0], int(table[peer, 0]), pairs):
                if read(pid, _ctypes.addressof(local), count, _ctypes.addressof(remote), count, 0) != nbytes:
                    ok = False
            if not ok or not _np.array_equal(probe, table[peer, 2:4]):  # another process under that pid
                ok = False
                break
        everyone = _np.zeros(1, dtype=_np.int64)
        # Every rank's token stays alive until here: nobody leaves before every read is done.
        call(comm.Iallreduce(_np.array([int(ok)], dtype=_np.int64), everyone, op=MPI.MIN))
        return cls(table[:, 0].tolist(), rank, root) if everyone[0] else None

    def bind(self, comm, buffers: list, call) -> list:
        """This rank's copies for the direct transfers ``buffers`` (plan order, same count on every rank).

        Collective (one all-gather of addresses, skipped when there is nothing
        to move). Root writes bytes ``[0, share)`` of each receiver's transfers
        (``share`` = 0.8 x total / size), each receiver reads the rest. Returns ``[]`` for nothing to
        copy and ``None`` when the ranks' sizes differ (then nothing is copied).
        """
        size, rank, root = len(self.pids), self.rank, self.root
        if not buffers:
            return []
        mine = _np.array([(MPI.Get_address(b), len(b)) for b in buffers], dtype=_np.int64)
        table = _np.empty((size,) + mine.shape, dtype=_np.int64)
        call(comm.Iallgather(mine, table))
        if not (table[:, :, 1] == mine[:, 1]).all():
            return None
        total = int(mine[:, 1].sum())
        # An even split (total / size) leaves root, which also packs the buckets, last to finish;
        # 0.8 of it balanced the two sides best at 2 ranks here (0.3-0.6 x total tried).
        share = 4 * total // (5 * size)
        read, write = _CALLS
        if rank == root:
            return [batch for peer in range(size) if peer != root
                    for batch in _batches(write, self.pids[peer], _byte_range(mine, table[peer], 0, share))]
        return _batches(read, self.pids[root], _byte_range(mine, table[root], share, total))

    @staticmethod
    def run(copies: list) -> bool:
        """Carry out ``copies`` (from :meth:`bind`); False when any copy failed or fell short."""
        if copies is None:
            return False
        for call, pid, local, remote, count, nbytes in copies:
            if call(pid, _ctypes.addressof(local), count, _ctypes.addressof(remote), count, 0) != nbytes:
                return False
        return True
