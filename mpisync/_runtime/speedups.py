"""The optional C loops (``mpisync._speedups``), or ``None`` where they are not built or are off.

Callers keep a Python or kernel path for every function, so the package works
without a compiler; ``MPISYNC_SPEEDUPS=0`` turns the C loops off (the tests run
both ways and compare bytes).
"""

from __future__ import annotations

from ..config import env_switch

__all__ = ["speedups", "enabled"]


def _load(requested: bool | None = None):
    if requested is None:
        requested = env_switch("MPISYNC_SPEEDUPS", True)
    if not requested:
        return None
    try:
        # a C extension, built or not: mypy reads no compiled module (the attr-defined ignore)
        from .. import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _speedups


#: The ``mpisync._speedups`` module (``BufferList``, ``same_items``), or ``None``.
speedups = _load()


def enabled(requested: bool | None = None) -> bool:
    """Whether the C loops are used here (``requested``: as if ``MPISYNC_SPEEDUPS`` said so)."""
    return (speedups if requested is None else _load(requested)) is not None
