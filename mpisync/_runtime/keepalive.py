"""Objects that must outlive an operation that did not complete: kept for the rest of the process.

MPI cannot cancel a collective. When a wait gives up on one (a timeout, an
abandoned torch operation), MPI may still write into its buffers and still
refers to its request and communicator: freeing any of them, or handing a
buffer to the next operation, would let MPI write into memory that now
belongs to something else. Everything in that state is handed to
:func:`keep_alive`, the one place that holds it.
"""

from __future__ import annotations

__all__ = ["keep_alive", "kept"]

_KEPT: list = []


def keep_alive(*objects) -> None:
    """Hold ``objects`` (``None`` is skipped) for the rest of the process, never to be used
    again."""
    _KEPT.extend(o for o in objects if o is not None)


def kept() -> int:
    """How many objects are held (for tests and diagnostics)."""
    return len(_KEPT)
