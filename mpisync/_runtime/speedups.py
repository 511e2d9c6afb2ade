"""The loops of the cold and repeated sync, each in C (``mpisync._speedups``) where it is built and
on, else in Python (:mod:`mpisync._runtime.pyloops`): the same functions, so every build runs the
same program.

``MPISYNC_SPEEDUPS=0`` takes the Python form of all of them, as an install without a C compiler
does; ``MPISYNC_SPEEDUPS_WITHOUT=array_list,same_states`` of the named ones only (for the
with/without figures in docs/performance.md).
"""

from __future__ import annotations

import os as _os
import types as _types

from ..config import env_switch
from . import pyloops as _pyloops

__all__ = ["loops", "speedups", "enabled", "compiled_lists", "NAMES"]

#: Every loop, by name: each is ``mpisync._speedups``'s or :mod:`mpisync._runtime.pyloops`'s.
NAMES = tuple(_pyloops.__all__)


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


def choose(compiled, without: frozenset = frozenset()) -> _types.SimpleNamespace:
    """The loops: ``compiled``'s (the C module, or None) except those named in ``without``."""
    chosen = {
        name: getattr(_pyloops if compiled is None or name in without else compiled, name)
        for name in NAMES
    }
    return _types.SimpleNamespace(**chosen)


#: The ``mpisync._speedups`` module, or ``None`` (not built, or ``MPISYNC_SPEEDUPS=0``).
speedups = _load()

#: C loops replaced by their Python form for the with/without figures (``MPISYNC_SPEEDUPS_WITHOUT``)
_WITHOUT = frozenset(
    name.strip() for name in _os.environ.get("MPISYNC_SPEEDUPS_WITHOUT", "").split(",") if name
)

#: The loops every path calls (see the module doc).
loops = choose(speedups, _WITHOUT)

#: Whether copy lists are C ``BufferList`` objects (the arena then copies them with their loops).
compiled_lists = loops.BufferList is not _pyloops.BufferList


def enabled(requested: bool | None = None) -> bool:
    """Whether the C loops are used here (``requested``: as if ``MPISYNC_SPEEDUPS`` said so)."""
    return (speedups if requested is None else _load(requested)) is not None
