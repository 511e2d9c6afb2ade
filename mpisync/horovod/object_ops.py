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
from .process_sets import ProcessSet

__all__ = ["broadcast_object", "allgather_object"]


def _encoded(obj: Any, rank: int) -> bytes:
    """``b"o"`` and ``obj`` encoded, or ``b"e"`` and why it cannot travel."""
    try:
        return b"o" + _objects.encode(obj)
    # whatever fails (a meta tensor, a sparse one, a user's type), the failure travels instead
    # of the object: every rank learns it, no rank waits
    except Exception as exc:  # noqa: BLE001
        return b"e" + f"rank {rank}: cannot send {exc}".encode()


def broadcast_object(
    obj: Any = None,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet | None = None,
) -> Any:
    """Give every rank of the set ``root_rank``'s ``obj``.

    Unlike Horovod, which pickles (cloudpickle) and so runs code on the receivers, the object
    travels in a safe encoding: bools, numbers (numpy scalars keep their type), strings and
    ``None``; lists, tuples, sets, frozensets and dicts with str or int keys; numeric numpy
    arrays and torch tensors (which arrive on the CPU). Anything else is refused, naming its
    type. Only the root's ``obj`` is read.

    Args:
        obj: The object to send, on the root; ignored on the other ranks.
        root_rank: The sender, a rank of :func:`init`'s communicator in the set (default 0).
        name: The operation's name, matched across ranks (default: automatic).
        process_set: The ranks that receive (default: every rank).

    Returns:
        The root's object, decoded anew on every rank (the root gets a copy too).

    Raises:
        ValueError: :func:`init` has not been called.
        HorovodArgumentError: The root's object holds a type that cannot travel, or
            ``root_rank`` is not in the set (on every rank); the name is pending or the set
            unusable (this rank).
        HorovodInternalError: The ranks gave different roots, or wait for other operations.
        mpisync.SyncTimeoutError: A rank did not take part within ``MPISYNC_TIMEOUT``.
    """

    root, error = set_root(root_rank, process_set)

    def run(comm, call, descs):
        payload = _encoded(obj, root_rank) if comm.rank == root else b""
        data = _broadcast_bytes(comm, payload, root, call)
        if data[:1] == b"e":
            return HorovodArgumentError(f"mpisync: broadcast_object: {data[1:].decode()}")
        return _objects.decode(data[1:])

    desc = _desc("broadcast_object", [root_rank], [], error=error)
    return _raised(synchronize(Handle(*_submit(process_set, "broadcast_object", name, desc, run))))


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet | None = None
) -> list[Any]:
    """Gather every rank's ``obj``, in rank order, on every rank of the set.

    Objects travel in the safe encoding of :func:`broadcast_object` (never pickled, unlike
    Horovod's): a type that cannot travel on any rank is refused on every rank.

    Args:
        obj: This rank's object.
        name: The name the ranks match the operation by (default: automatic).
        process_set: The ranks to gather from (default: every rank).

    Returns:
        A list with one decoded object per rank of the set, in rank order.

    Raises:
        ValueError: Called before :func:`init`.
        HorovodArgumentError: An object of some rank cannot travel (every rank gets the
            reasons); or, on this rank, the name is pending or the set is unusable.
        HorovodInternalError: The ranks wait for different operations.
        mpisync.SyncTimeoutError: The gather did not complete within ``MPISYNC_TIMEOUT``.
    """

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
