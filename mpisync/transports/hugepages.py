"""Transparent huge pages for the arrays the node's cross-memory paths reduce or broadcast again
and again.

torch's CPU allocator leaves tensors on 4 KiB pages (unless ``THP_MEM_ALLOC_ENABLE=1``), and
``process_vm_readv``/``writev`` pin a peer's pages one by one: a 25 MiB all-reduce by
cross-memory ran at about half the machine's limit on them, and at 0.8 of it on huge pages
(docs/allreduce.md, "Huge pages"); a repeated broadcast of a torch ``state_dict`` likewise
(docs/performance.md). The second time an array's memory comes to these paths at the same
address and size (a gradient, a DDP bucket, a parameter a repeated sync sends again: memory a
job reuses), :func:`advise` asks the kernel to back the 2 MiB-aligned part of it with huge pages
(``MADV_HUGEPAGE``) and to do so now (``MADV_COLLAPSE``, Linux 6.1 and later: a copy of those
pages, once). The bytes do not change. A range is collapsed once per process: memory freed and
mapped again at the same address (a new tensor each call) costs at most that one collapse.
Where the kernel refuses (older kernels, THP ``never``, no memory to compact), nothing changes.
``MPISYNC_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes as _ctypes
import sys as _sys

from ..config import env_switch

__all__ = ["advise", "advise_ranges"]

_HUGE = 2 << 20  # the huge page size of x86-64 and of arm64 with 4 KiB pages
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_MEMORY = 4096  # ranges remembered; beyond, forgotten all at once (each may collapse once more)

# (start, stop) of each 2 MiB-aligned range seen: False once seen, True once collapsed.
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
    """Collapse into huge pages the 2 MiB-aligned part of each of ``arrays`` (numpy arrays,
    C-contiguous, this process's) whose range this process has seen once before and never
    collapsed. Never raises: the kernel's refusal leaves the pages as they are."""
    advise_ranges((array.ctypes.data, array.nbytes) for array in arrays)


def advise_ranges(spans) -> None:
    """:func:`advise` of memory given as ``(address, nbytes)`` pairs."""
    if _madvise is None or not env_switch("MPISYNC_HUGE_PAGES", True):
        return
    ranges = {_aligned(address, nbytes) for address, nbytes in spans}
    for start, stop in ranges:
        if stop <= start:
            continue
        state = _seen.get((start, stop))
        if state is None:
            if len(_seen) >= _MEMORY:
                _seen.clear()
            _seen[start, stop] = False
        elif not state:
            _seen[start, stop] = True
            if _madvise(start, stop - start, _MADV_HUGEPAGE) == 0:
                _madvise(start, stop - start, _MADV_COLLAPSE)


def _aligned(address: int, nbytes: int) -> tuple:
    """The 2 MiB-aligned part of ``nbytes`` at ``address``: ``(start, stop)``, empty when
    ``stop <= start``."""
    return -(-address // _HUGE) * _HUGE, (address + nbytes) // _HUGE * _HUGE
