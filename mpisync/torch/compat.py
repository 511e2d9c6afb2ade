"""Which torch releases the backend supports, and the check that this torch has what the backend
cannot do without (docs/compatibility.md lists every internal it uses and its fallback)."""

from __future__ import annotations

import inspect

import torch
import torch.distributed as dist

__all__ = ["OLDEST", "NEWEST", "missing", "require"]

#: The oldest and newest torch releases the torch tests pass on in CI.
OLDEST = "2.4.1"
NEWEST = "2.15.0"


def _takes(function, *names: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return all(name in parameters for name in names)


def missing(distributed=dist) -> list[str]:
    """What of torch's Python backend interface ``distributed`` (``torch.distributed``) lacks
    (empty: nothing): a ``Work`` class to subclass, a ``ProcessGroup`` class to subclass, and
    ``Backend.register_backend`` taking a creator of the extended form for given devices."""
    dist = distributed
    lacks = []
    if not isinstance(getattr(dist, "_Work", None), type):
        lacks.append("torch.distributed._Work (the work objects' base class)")
    if not isinstance(getattr(dist, "ProcessGroup", None), type):
        lacks.append("torch.distributed.ProcessGroup (the process group's base class)")
    register = getattr(getattr(dist, "Backend", None), "register_backend", None)
    if register is None or not _takes(register, "extended_api", "devices"):
        lacks.append("Backend.register_backend(..., extended_api=, devices=)")
    return lacks


def require(distributed=dist) -> None:
    """Raise ``ImportError`` naming the supported releases where this torch lacks what the
    backend needs (:func:`missing`); a release outside them that has it is used as it is."""
    lacks = missing(distributed)
    if lacks:
        raise ImportError(
            f"mpisync's torch backend supports torch {OLDEST} to {NEWEST} (docs/compatibility.md);"
            f" torch {torch.__version__} lacks: {'; '.join(lacks)}. mpisync.sync_params and "
            "sync_state do not need it"
        )
