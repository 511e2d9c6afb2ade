"""Memory held during a sync: Python/numpy allocations traced by ``tracemalloc``, and peak RSS."""

from __future__ import annotations

import resource as _resource
import sys as _sys
import tracemalloc as _tracemalloc

__all__ = ["traced_peak", "peak_rss_bytes"]


def traced_peak(fn) -> int:
    """Bytes allocated by Python and numpy at the peak of ``fn()``, beyond what was held before."""
    _tracemalloc.start()
    try:
        _tracemalloc.reset_peak()
        before, _ = _tracemalloc.get_traced_memory()
        fn()
        _, peak = _tracemalloc.get_traced_memory()
    finally:
        _tracemalloc.stop()
    return max(0, peak - before)


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far."""
    rss = _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss
    return rss if _sys.platform == "darwin" else rss * 1024
