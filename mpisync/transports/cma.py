"""Host tensors between the ranks of one node by cross-memory attach, both sides copying.

MPI's single-copy path between processes (CMA, ``process_vm_readv``) is run by
the receiver alone; on memory in 4 KiB pages (tensors allocated one by one) it
pins and copies page by page, slower than on the huge pages of one large
allocation (figures: docs/performance.md). Here root writes the first share of every
receiver's large tensors (``process_vm_writev``) while each receiver reads the
rest (``process_vm_readv``), straight from tensor to tensor: two cores share
the work. Small tensors (the plan's fused ones) are read by the receivers
alone, a run of them at a time: root's gaps between them (allocator headers,
under a page) land in a scratch page, so one remote range covers many tensors.
No packing, no MPI data movement; one all-reduce ends the sync.

Writing into another process needs care, so: a rank copies to or from a peer
only after reading back, at the address that peer published, the random token
it published (a pid from another PID namespace or node is never written to);
addresses are exchanged again whenever any rank rebuilt its steps, and the
compiled steps hold the arrays, so their memory does not move in between; a
failed or short copy on any rank makes every rank redo the sync's transfers
through MPI (see :mod:`mpisync.sync`) and keep MPI afterwards.
"""

from __future__ import annotations

import ctypes as _ctypes
import functools as _functools
import hashlib as _hashlib
import os as _os
import secrets as _secrets
import sys as _sys

import numpy as _np
from mpi4py import MPI

from ..config import env_switch

__all__ = [
    "BATCH",
    "Copies",
    "CrossMemory",
    "Iovec",
    "enabled",
    "host_word",
    "iovecs",
    "iovecs_at",
    "read_range",
    "split_batches",
    "system_calls",
    "transfer",
]

BATCH = 1024  # IOV_MAX on Linux: the most iovecs one call takes on either side
_PAGE = 4096  # the smallest page size: a shorter gap never spans an unmapped page
#: Root's part of the copies, as a fraction of an even split between the ranks' cores: root also
#: posts and waits, and finished last with an even split (docs/performance.md).
ROOT_SHARE = 0.8


class Iovec(_ctypes.Structure):
    """One ``struct iovec``: a range of memory, here or in a peer."""

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
        call.argtypes = [
            _ctypes.c_int,
            _ctypes.c_void_p,
            _ctypes.c_ulong,
            _ctypes.c_void_p,
            _ctypes.c_ulong,
            _ctypes.c_ulong,
        ]
    return calls


_CALLS = _bind()


def system_calls():
    """``(process_vm_readv, process_vm_writev)`` (ctypes functions), or None where the OS lacks
    them."""
    return _CALLS


def iovecs(arrays: list):
    """The iovecs of ``arrays`` (contiguous)."""
    return iovecs_at([(a.ctypes.data, a.nbytes) for a in arrays])


def iovecs_at(ranges: list):
    """The iovecs of ``(address, nbytes)`` ``ranges``."""
    return (Iovec * len(ranges))(*ranges)


def transfer(direction: int, pid: int, local, remote) -> int:
    """``process_vm_readv`` (``direction`` 0) or ``process_vm_writev`` (1) between ``local`` and
    ``remote`` iovecs: the bytes moved, or -1."""
    assert _CALLS is not None  # enabled() was true on every rank
    return _CALLS[direction](
        pid, _ctypes.addressof(local), len(local), _ctypes.addressof(remote), len(remote), 0
    )


def read_range(pid: int, here: int, there: int, nbytes: int) -> int:
    """``process_vm_readv`` of one range: the bytes read, or -1."""
    return transfer(0, pid, iovecs_at([(here, nbytes)]), iovecs_at([(there, nbytes)]))


def enabled(requested: bool | None = None) -> bool:
    """Whether this rank may use cross-memory copies: asked for (``requested``, else
    ``MPISYNC_CROSS_MEMORY``, on unless 0) and offered by the OS (Linux)."""
    if requested is None:
        requested = env_switch("MPISYNC_CROSS_MEMORY", True)
    return bool(requested) and _CALLS is not None


@_functools.lru_cache(maxsize=1)
def host_word() -> int:
    """This rank's node, as MPI names it (``Get_processor_name``), hashed to a signed 64-bit word:
    ranks compare words to learn whether they all share one node. Computed once per process."""
    digest = _hashlib.blake2b(MPI.Get_processor_name().encode(), digest_size=8).digest()
    return int.from_bytes(digest, _sys.byteorder, signed=True)


def _batches(call, pid: int, pairs: list) -> list:
    """``(call, pid, local iovecs, local count, remote iovecs, remote count, bytes)`` for
    ``(local, remote, nbytes)`` pairs, at most ``BATCH`` on each side per call; pairs whose
    remote bytes follow each other share one remote iovec (a region read in one piece)."""
    out = []
    for start in range(0, len(pairs), BATCH):
        group = pairs[start : start + BATCH]
        remote: list[list[int]] = []
        for _, there, n in group:
            if remote and remote[-1][0] + remote[-1][1] == there:
                remote[-1][1] += n
            else:
                remote.append([there, n])
        # ctypes makes each (base, len) tuple an Iovec: the misc ignores
        local = (Iovec * len(group))(*[(here, n) for here, _, n in group])  # type: ignore[misc]
        out.append(
            (
                call,
                pid,
                local,
                len(group),
                (Iovec * len(remote))(*map(tuple, remote)),  # type: ignore[misc]
                len(remote),
                sum(n for _, _, n in group),
            )
        )
    return out


def _regions(local: _np.ndarray, remote: _np.ndarray, scratch: int) -> list:
    """``(local, remote, nbytes)`` pairs reading every piece, in remote address order, with the gaps
    under a page between remote pieces read into ``scratch`` (a page): the remote side of a run
    of small tensors then becomes one region, pinned page by page once instead of tensor by tensor.

    A gap shorter than a page lies in pages that hold bytes of the pieces around it, so it is
    mapped; it is only read, and only into ``scratch``.
    """
    pairs, end = [], None
    for i in sorted(range(len(remote)), key=lambda i: remote[i, 0]):
        there, nbytes = int(remote[i, 0]), int(remote[i, 1])
        if not nbytes:
            continue
        if end is not None and 0 < there - end < _PAGE:
            pairs.append((scratch, end, there - end))
        pairs.append((int(local[i, 0]), there, nbytes))
        end = there + nbytes
    return pairs


def _byte_range(local: _np.ndarray, remote: _np.ndarray, start: int, stop: int) -> list:
    """``(local address, remote address, nbytes)`` covering bytes ``[start, stop)`` of the pieces
    laid end
    to end; ``local``/``remote`` are ``(k, 2)`` tables of ``(address, nbytes)``."""
    pairs, offset = [], 0
    for (here, nbytes), (there, _) in zip(local.tolist(), remote.tolist()):
        lo, hi = max(start, offset), min(stop, offset + nbytes)
        if lo < hi:
            pairs.append((here + lo - offset, there + lo - offset, hi - lo))
        offset += nbytes
    return pairs


class CrossMemory:
    """Every rank's pid, checked reachable by a token read; :meth:`bind` compiles one rank's
    copies."""

    def __init__(self, pids: list, rank: int, root: int):
        self.pids, self.rank, self.root = pids, rank, root
        # where the gaps between root's small tensors land
        self._scratch = _np.empty(_PAGE, dtype=_np.uint8)
        # the part of each receiver's large-tensor bytes root writes; None: not chosen yet
        self.fraction: float | None = None
        # (direct bytes, all bytes) of the last sync's copies: the same on every rank
        self.last = (0, 0)

    @classmethod
    def open(cls, comm, root: int, call, requested: bool | None = None) -> CrossMemory | None:
        """Check on every rank of ``comm`` that root and every other rank can reach each other; the
        object, or None on every rank. Collective (an all-gather and an all-reduce, waited with
        ``call``)."""
        rank, size = comm.rank, comm.size
        mine = enabled(requested)
        # peers read this array
        token = _np.frombuffer(_secrets.token_bytes(16), dtype=_np.int64).copy()
        host = host_word()
        row = _np.array(
            [_os.getpid() if mine else 0, token.ctypes.data, token[0], token[1], host],
            dtype=_np.int64,
        )
        table = _np.empty((size, 5), dtype=_np.int64)
        call(comm.Iallgather(row, table))
        # One node only (as MPI names them): on several, some pairs could not reach each other.
        ok = bool(table[:, 0].all()) and bool((table[:, 4] == host).all())
        peers = [r for r in range(size) if r != rank] if rank == root else [root]
        probe = _np.zeros(2, dtype=_np.int64)
        try:
            for peer in peers if ok else ():
                probe[:] = 0
                pairs = [(probe.ctypes.data, int(table[peer, 1]), 16)]
                if not Copies.run_batches(_batches(_CALLS[0], int(table[peer, 0]), pairs)):
                    ok = False
                # another process under that pid
                if not ok or not _np.array_equal(probe, table[peer, 2:4]):
                    ok = False
                    break
        except Exception:  # noqa: BLE001 - any local failure: every rank learns it below and keeps MPI
            ok = False
        everyone = _np.zeros(1, dtype=_np.int64)
        # Every rank's token stays alive until here: nobody leaves before every read is done.
        call(comm.Iallreduce(_np.array([int(ok)], dtype=_np.int64), everyone, op=MPI.MIN))
        return cls(table[:, 0].tolist(), rank, root) if everyone[0] else None

    def bind(self, comm, direct: list, small: list, call) -> Copies:
        """This rank's copies for the plan's direct transfers ``direct`` and the masters of its
        fused
        tensors ``small`` (byte buffers, plan order, the same counts on every rank).

        Collective (one all-gather of addresses, skipped when there is nothing
        to move). Root writes the first :attr:`fraction` of each receiver's
        direct transfers; each receiver reads the rest of them, and every small
        tensor, from root's runs of small tensors (see :func:`_regions`):
        writing into a peer takes one iovec per tensor, pinned on its own,
        which is slow for small ones.
        """
        buffers = list(direct) + list(small)
        if not buffers:
            return Copies(self, None, None, 0, [])  # nothing to move
        size = len(self.pids)
        mine = _np.array([(MPI.Get_address(b), len(b)) for b in buffers], dtype=_np.int64)
        table = _np.empty((size,) + mine.shape, dtype=_np.int64)
        call(comm.Iallgather(mine, table))
        if not (table[:, :, 1] == mine[:, 1]).all():
            return Copies(self, None, None, 0, None)  # fails when run
        d = len(direct)
        total = int(mine[:d, 1].sum())
        if self.fraction is None and total:
            # An even split leaves root last to finish: root takes a fixed ROOT_SHARE of an even
            # share (figures: docs/performance.md). Fixed, so every rank computes the same split
            # with no timing exchanged.
            self.fraction = min(1.0, ROOT_SHARE * int(mine[:, 1].sum()) / (size * total))
        regions = (
            []
            if self.rank == self.root
            else _regions(mine[d:], table[self.root, d:], self._scratch.ctypes.data)
        )
        return Copies(self, mine[:d], table[:, :d], int(mine[d:, 1].sum()), regions)


class Copies:
    """One rank's copies for one set of arrays, bound to every rank's addresses; :meth:`split`
    redoes
    the direct part for the current :attr:`CrossMemory.fraction` without talking to the others."""

    def __init__(self, cross: CrossMemory, mine, table, small_bytes: int, regions):
        # mine, table: (address, nbytes) of this rank's and every rank's direct transfers
        self._cross, self._mine, self._table, self._regions = cross, mine, table, regions
        self.direct_bytes = int(mine[:, 1].sum()) if mine is not None and len(mine) else 0
        self.total_bytes = self.direct_bytes + small_bytes
        self.batches: list | None = None  # None: the ranks' sizes differed, so every run fails
        if regions is not None:
            self.split()

    def split(self) -> None:
        """(Re)build the system calls for the current split of the large-tensor bytes."""
        cross, total = self._cross, self.direct_bytes
        # bind set the fraction when there were direct bytes (total): the operator ignore
        share = int(round(cross.fraction * total)) if total else 0  # type: ignore[operator]
        self.batches = split_batches(
            cross.rank, cross.root, cross.pids, self._mine, self._table, share, self._regions
        )

    def run(self) -> bool:
        """Carry out this rank's copies; False when any failed or fell short (or addresses did not
        match)."""
        self._cross.last = (self.direct_bytes, self.total_bytes)
        return self.run_batches(self.batches)

    @staticmethod
    def run_batches(batches) -> bool:
        """Carry out ``batches`` (from :func:`_batches`); False when any copy failed or fell
        short."""
        if batches is None:
            return False
        for call, pid, local, nlocal, remote, nremote, nbytes in batches:
            if (
                call(pid, _ctypes.addressof(local), nlocal, _ctypes.addressof(remote), nremote, 0)
                != nbytes
            ):
                return False
        return True


def split_batches(
    rank: int, root: int, pids: list, mine, table, share: int, extra: tuple | list = ()
) -> list:
    """This rank's system calls for a broadcast from ``root`` of pieces laid end to end
    (``mine``: this rank's ``(address, nbytes)`` rows; ``table``: every rank's): root writes the
    first ``share`` bytes into every receiver, each receiver reads the rest from root, and its
    ``extra`` ``(local, remote, nbytes)`` pairs too (root's small tensors). The one split both
    cross-memory broadcasts use (the parameter sets' :class:`Copies` and
    :mod:`mpisync.transports.crossbcast`)."""
    assert _CALLS is not None  # enabled() was true on every rank
    read, write = _CALLS
    total = int(mine[:, 1].sum()) if len(mine) else 0
    if rank == root:
        if not total:
            return []
        return [
            batch
            for peer in range(len(pids))
            if peer != root
            for batch in _batches(write, pids[peer], _byte_range(mine, table[peer], 0, share))
        ]
    pairs = _byte_range(mine, table[root], share, total) if total else []
    return _batches(read, pids[root], pairs + list(extra))
