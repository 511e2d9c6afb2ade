"""Transparent huge pages for the arrays the node's cross-memory paths reduce or broadcast again
and again.

torch's CPU allocator leaves tensors on 4 KiB pages (unless ``THP_MEM_ALLOC_ENABLE=1``), and
``process_vm_readv``/``writev`` pin a peer's pages one by one: a 25 MiB all-reduce by
cross-memory ran at about half the machine's limit on them, and at 0.8 of it on huge pages
(docs/allreduce.md, "Huge pages"); a repeated broadcast of a torch ``state_dict`` likewise
(docs/performance.md). The second time an array's memory comes to these paths at the same
address and size (a gradient, a DDP bucket, a parameter a repeated sync sends again: memory a
job reuses), :func:`advise` asks the kernel to back every 2 MiB block the array touches with huge
pages (``MADV_HUGEPAGE``) and to do so now (``MADV_COLLAPSE``, Linux 6.1 and later: a copy of
those pages, once). Tensors allocated one by one start at no particular 2 MiB boundary and a
model's are a few MiB each, so the blocks at an array's edges, which also hold its neighbours'
bytes (other tensors, the allocator's headers), are taken too: the blocks wholly inside a
``state_dict``'s tensors held about half of its bytes. No byte changes, the array's or its
neighbours'.

A block is collapsed once for each array that brings it (its address and size): the same memory
freed and mapped again at the same address and size (a new tensor each call) costs at most that
one collapse, and another array there is collapsed after its own second sighting. Where
the kernel refuses (older kernels, THP ``never``, no memory to compact), nothing changes.
``MPISYNC_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes as _ctypes
import errno as _errno
import sys as _sys

from ..config import env_switch

__all__ = ["advise", "advise_ranges"]

_HUGE = 2 << 20  # the huge page size of x86-64 and of arm64 with 4 KiB pages
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_MEMORY = 4096  # (block, array) pairs remembered; beyond, forgotten at once (may collapse again)

# (2 MiB block: its address // 2 MiB, (address, nbytes) of the array that brought it) -> False once
# seen, True once collapsed
_seen: dict = {}


def _bind():
    if not _sys.platform.startswith("linux"):
        return None
    try:
        madvise = _ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.restype = _ctypes.c_int
    madvise.argtypes = [_ctypes.c_void_p, _ctypes.c_size_t, _ctypes.c_int]
    return madvise


_madvise = _bind()


def advise(arrays) -> None:
    """Collapse into huge pages every 2 MiB block each of ``arrays`` (numpy arrays, C-contiguous,
    this process's) touches, where this process saw the same array there once before and has not
    collapsed the block for it. Never raises: the kernel's refusal leaves the pages as they are."""
    advise_ranges((array.ctypes.data, array.nbytes) for array in arrays)


def advise_ranges(spans) -> None:
    """:func:`advise` of memory given as ``(address, nbytes)`` pairs."""
    if _madvise is None or not env_switch("MPISYNC_HUGE_PAGES", True):
        return
    owners: dict = {}  # block -> the first span of this call that touches it
    for address, nbytes in spans:
        for block in range(*_blocks(address, nbytes)):
            owners.setdefault(block, (address, nbytes))
    due = []
    for block in sorted(owners):
        key = (block, owners[block])
        state = _seen.get(key)
        if state is None:
            if len(_seen) >= _MEMORY:
                _seen.clear()
            _seen[key] = False
        elif not state:
            _seen[key] = True
            due.append(block)
    for first, stop in _runs(due):
        start, length = first * _HUGE, (stop - first) * _HUGE
        # ENOMEM: part of the run is unmapped; the kernel still advised the mapped rest
        if _madvise(start, length, _MADV_HUGEPAGE) == 0 or _ctypes.get_errno() == _errno.ENOMEM:
            _madvise(start, length, _MADV_COLLAPSE)


def collapsed() -> set:
    """The blocks collapsed so far, for any array (for tests)."""
    return {block for (block, _), done in _seen.items() if done}


def _blocks(address: int, nbytes: int) -> tuple:
    """``(first, stop)``: the 2 MiB blocks holding some of ``nbytes`` at ``address``, as ``range``
    takes them."""
    if nbytes <= 0:
        return 0, 0
    return address // _HUGE, -(-(address + nbytes) // _HUGE)


def _runs(blocks: list) -> list:
    """Sorted ``blocks`` as ``(first, stop)`` runs of consecutive ones: one pair of advice each."""
    runs: list = []
    for block in blocks:
        if runs and runs[-1][1] == block:
            runs[-1][1] = block + 1
        else:
            runs.append([block, block + 1])
    return runs
