"""``broadcast_object`` and ``allgather_object``: Python objects between ranks in the safe
encoding of :mod:`mpisync.horovod.objects` (never pickle), as operations of a process set's
engine (matched by name like the tensor operations)."""

from __future__ import annotations

from typing import Any

from ..params.agreement import allgather_bytes
from ..state import _broadcast_bytes
from . import objects as _objects
from .errors import HorovodArgumentError
from .ops import Handle, _desc, _submit, set_root, synchronize

__all__ = ["broadcast_object", "allgather_object"]


def _encoded(obj: Any, rank: int) -> bytes:
    """``b"o"`` and ``obj`` encoded, or ``b"e"`` and why it cannot travel."""
    try:
        return b"o" + _objects.encode(obj)
    # whatever fails (a meta tensor, a sparse one, a user's type), the failure travels instead
    # of the object: every rank learns it, no rank waits
    except Exception as exc:  # noqa: BLE001
        return b"e" + f"rank {rank}: cannot send {exc}".encode()


def broadcast_object(obj: Any = None, root_rank: int = 0, name=None, process_set=None):
    """root_rank's ``obj`` on every rank of the set."""

    root, error = set_root(root_rank, process_set)

    def run(comm, call, descs):
        payload = _encoded(obj, root_rank) if comm.rank == root else b""
        data = _broadcast_bytes(comm, payload, root, call)
        if data[:1] == b"e":
            return HorovodArgumentError(f"mpisync: broadcast_object: {data[1:].decode()}")
        return _objects.decode(data[1:])

    desc = _desc("broadcast_object", [root_rank], [], error=error)
    return _raised(synchronize(Handle(*_submit(process_set, "broadcast_object", name, desc, run))))


def allgather_object(obj: Any, name=None, process_set=None) -> list:
    """Every rank's ``obj``, in rank order."""

    def run(comm, call, descs):
        parts = allgather_bytes(comm, _encoded(obj, comm.rank), call)
        errors = [p[1:].decode() for p in parts if p[:1] == b"e"]
        if errors:
            return HorovodArgumentError("mpisync: allgather_object: " + "; ".join(errors))
        return [_objects.decode(p[1:]) for p in parts]

    desc = _desc("allgather_object", [], [])
    return _raised(synchronize(Handle(*_submit(process_set, "allgather_object", name, desc, run))))


def _raised(result):
    if isinstance(result, HorovodArgumentError):
        raise result
    return result
