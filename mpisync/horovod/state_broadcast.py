"""``broadcast_parameters`` and ``broadcast_optimizer_state``, with Horovod's signatures (also
``mpisync.broadcast_parameters`` and ``mpisync.broadcast_optimizer_state``)::

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

The communicator is ``comm``, else ``hvd.init()``'s, else ``MPI.COMM_WORLD``; neither needs
``hvd.init()``. Parameters are synced as by :func:`mpisync.sync_params`, the optimizer's
state as by :func:`mpisync.sync_state`. Ranks whose optimizer has no state yet
(the usual resume: only root loaded a checkpoint) first get root's state
structure, described by root as JSON (shapes, dtypes), never pickled.
"""

from __future__ import annotations

import collections.abc as _abc
import json as _json
import warnings as _warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

from ..errors import InvalidParamError
from ..params.agreement import all_equal, allgather_bytes, merge_ranks, rank_list
from ..state import _broadcast_bytes, sync_state
from ..sync import ParamSync
from .context import default_comm

if TYPE_CHECKING:
    import torch

    from .process_sets import ProcessSet

__all__ = ["broadcast_parameters", "broadcast_optimizer_state"]

Params = Mapping[str, Any] | Iterable[tuple[str, Any]]


def _agree_on_local_errors(comm, error: str, call) -> None:
    """Raise the same :class:`InvalidParamError` on every rank if any rank's ``error`` is not
    empty."""
    high, _ = all_equal(comm, [1 if error else 0], call)
    if high[0]:
        messages = [
            (rank, raw.decode(errors="replace"))
            for rank, raw in enumerate(allgather_bytes(comm, error.encode(), call))
            if raw
        ]
        raise InvalidParamError(
            f"mpisync: invalid input on rank(s) {rank_list(r for r, _ in messages)}: "
            + "; ".join(merge_ranks(messages))
        )


def _as_mapping(params) -> tuple:
    """``(mapping, error)``: ``params`` as a name -> tensor mapping, or why it is not one."""
    if isinstance(params, _abc.Mapping):
        return params, ""
    if isinstance(params, (str, bytes)) or not isinstance(params, _abc.Iterable):
        return {}, (
            "params must be a mapping (state_dict()) or (name, tensor) pairs "
            "(named_parameters()), "
            f"got {type(params).__name__}"
        )
    mapping: dict = {}
    for i, item in enumerate(params):
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            return {}, f"item {i} of params is not a (name, tensor) pair: {type(item).__name__}"
        if item[0] in mapping:
            return {}, f"parameter name {item[0]!r} appears twice in params"
        mapping[item[0]] = item[1]
    return mapping, ""


def broadcast_parameters(
    params: Params,
    root_rank: int = 0,
    comm: MPI.Intracomm | None = None,
    process_set: ProcessSet | None = None,
) -> None:
    """Make every tensor of ``params`` ``root_rank``'s on every rank, in place (Horovod's
    ``broadcast_parameters``).

    Every rank calls it with the same names, shapes and dtypes. Unlike Horovod (one
    broadcast per tensor, by name), the tensors are synced together as by
    :func:`mpisync.sync_params` (fused, in ``sorted()`` name order) and checked first: a
    difference between ranks raises on every rank and writes nothing. It needs no
    :func:`~mpisync.horovod.init`.

    Args:
        params: A mapping of name to tensor (``model.state_dict()``) or an iterable of
            ``(name, tensor)`` pairs (``model.named_parameters()``).
        root_rank: The rank whose values every rank takes (a rank of the communicator).
        comm: The communicator (mpisync's addition); default: ``process_set``'s, else
            :func:`~mpisync.horovod.init`'s, else ``MPI.COMM_WORLD``.
        process_set: A process set whose ranks take part, when ``comm`` is not given.

    Raises:
        mpisync.InvalidParamError: On every rank, when a rank's ``params`` is neither a
            mapping nor ``(name, tensor)`` pairs, repeats a name, holds something that
            cannot be synced, or ``root_rank`` is out of range.
        mpisync.ManifestMismatchError: On every rank, when the ranks' names, shapes or dtypes
            differ.
        mpisync.SyncTimeoutError: A rank did not call it within ``MPISYNC_TIMEOUT`` (raised
            with ``MPISYNC_TIMEOUT_ABORT=0``; by default the job aborts), or
            :class:`mpisync.PeerExitedError` when a rank has exited.
        mpisync.horovod.HorovodInternalError: After :func:`init` and without ``comm``, the
            ranks called other operations meanwhile (it is the engine's operation
            ``broadcast_parameters.all``), or the broadcast failed on some ranks only.
    """
    target = default_comm(process_set) if comm is None else comm

    def body() -> None:
        with ParamSync(target, root=root_rank) as syncer:
            try:
                mapping, error = _as_mapping(params)
            except Exception as exc:  # an iterable that fails while read: every rank hears of it
                mapping, error = {}, f"cannot read params: {type(exc).__name__}: {exc}"
            syncer._collective_exchange(
                "argument check",
                list(mapping),
                lambda comm, call: _agree_on_local_errors(comm, error, call),
            )
            syncer.sync(mapping)

    _matched(comm, process_set, "broadcast_parameters", [root_rank], body)


def _matched(comm, process_set, kind: str, match: list, body) -> Any:
    """``body()``; after ``hvd.init()`` and without an explicit ``comm``, as an operation of the
    process set's engine, matched by name with the ranks' other operations."""
    from . import context
    from .ops import in_engine
    from .process_sets import resolve

    if comm is not None or context._context is None:
        return body()
    return in_engine(resolve(process_set), kind, "all", match, body)


def _describe(optimizer) -> dict:
    """This rank's optimizer state as JSON: per parameter index, each entry's kind, shape, dtype."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = optimizer.state_dict()["state"]
    described = {}
    for index, entries in state.items():
        described[str(index)] = {
            str(key): (
                [
                    "tensor",
                    list(value.shape),
                    str(value.dtype).replace("torch.", ""),
                    value.device == params[index].device,
                ]
                if isinstance(value, torch.Tensor)
                else ["value"]
            )
            for key, value in entries.items()
        }
    return {"params": len(params), "state": described}


def _skeleton(optimizer, root_description: dict, mine: dict) -> dict:
    """This rank's ``state_dict()`` with root's state structure: entries root has and this rank
    lacks
    are new tensors of root's shape and dtype (values follow in the sync); entries root lacks go."""
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state_dict = optimizer.state_dict()
    own = state_dict["state"]
    state = {}
    for index_text, entries in root_description["state"].items():
        index = int(index_text)
        have, kinds_here = own.get(index, {}), mine["state"].get(index_text, {})
        filled = {}
        for key, kind in entries.items():
            if key in have and kinds_here.get(key, ["?"])[0] == kind[0]:
                # a shape or dtype that differs is sync_state's error to name
                filled[key] = have[key]
            elif kind[0] == "tensor":
                device = params[index].device if kind[3] and index < len(params) else "cpu"
                filled[key] = torch.zeros(kind[1], dtype=getattr(torch, kind[2]), device=device)
            else:
                filled[key] = None  # root's value replaces it
        state[index] = filled
    return {**state_dict, "state": state}


def _zero_gradients(optimizer) -> None:
    """What Horovod does to an optimizer without state: a zero ``.grad`` for each parameter
    that requires one and has none (sparse for ``SparseAdam``)."""
    try:
        if optimizer.state_dict()["state"]:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
    except Exception:  # noqa: BLE001 - the exchange below reports an unreadable optimizer
        return
    import torch

    sparse = isinstance(optimizer, torch.optim.SparseAdam)
    for p in params:
        if p.requires_grad and p.grad is None:
            grad = torch.zeros_like(p)
            p.grad = grad.to_sparse() if sparse else grad


def _root_and_comm(root_rank, root, comm) -> tuple:
    """``(root, comm)`` from Horovod's ``root_rank``, ``root=`` (another name of it) and
    ``comm``; the older call ``broadcast_optimizer_state(optimizer, comm, root=r)`` still works,
    with a warning."""
    if isinstance(root_rank, MPI.Comm) and comm is None:
        _warnings.warn(
            "broadcast_optimizer_state(optimizer, comm, root=r) is the older form: write "
            "broadcast_optimizer_state(optimizer, root_rank=r, comm=comm)",
            DeprecationWarning,
            stacklevel=3,
        )
        root_rank, comm = 0, root_rank
    if root is not None and root_rank not in (0, root):
        raise InvalidParamError(
            f"broadcast_optimizer_state: root_rank={root_rank!r} and root={root!r} differ; "
            "root= is another name of root_rank, pass one of them"
        )
    return (root if root is not None else root_rank), (default_comm() if comm is None else comm)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int | MPI.Intracomm = 0,
    comm: MPI.Intracomm | None = None,
    *,
    root: int | None = None,
    process_set: ProcessSet | None = None,
) -> None:
    """Make a torch optimizer's state and hyper-parameters ``root_rank``'s on every rank
    (Horovod's ``broadcast_optimizer_state``).

    Ranks that have no state yet (only the root loaded a checkpoint, or the others never
    stepped) first get the root's state structure, described by the root as JSON and never
    pickled; then every tensor takes the root's bytes and every other value (step counts,
    learning rate, betas) the root's value and type, through :func:`mpisync.sync_state`,
    and the optimizer loads the result. Like Horovod, an optimizer without state first
    gets zero gradients where a parameter has none. It needs no :func:`~mpisync.horovod.init`.

    Args:
        optimizer: A ``torch.optim.Optimizer`` (or a ``DistributedOptimizer``), on every rank
            over parameters of the same shapes.
        root_rank: The rank whose state every rank takes. The older call
            ``broadcast_optimizer_state(optimizer, comm, root=r)`` (a communicator here)
            still works, with a DeprecationWarning.
        comm: The communicator (mpisync's addition); default: ``process_set``'s, else
            :func:`~mpisync.horovod.init`'s, else ``MPI.COMM_WORLD``.
        root: Another name of ``root_rank``, kept from mpisync's older signature.
        process_set: A process set whose ranks take part, when ``comm`` is not given.

    Raises:
        mpisync.InvalidParamError: ``root_rank`` and ``root`` differ; or, on every rank, a
            rank's optimizer state cannot be read, the root's structure cannot be built on a
            rank, a value cannot be synced, or the root is out of range.
        mpisync.ManifestMismatchError: On every rank, when a rank's state still differs
            from the root's in structure, shape or dtype (e.g. other parameter shapes).
        mpisync.SyncTimeoutError: A rank did not take part within ``MPISYNC_TIMEOUT``
            (with ``MPISYNC_TIMEOUT_ABORT=0``; by default the job is aborted).
        mpisync.horovod.HorovodInternalError: After :func:`init` and without ``comm``, the
            ranks called other operations meanwhile (it is the engine's operation
            ``broadcast_optimizer_state.all``), or it failed on some ranks only.
    """
    given = comm
    if comm is None and process_set is not None:
        comm = default_comm(process_set)
    _zero_gradients(optimizer)
    root, comm = _root_and_comm(root_rank, root, comm)
    if isinstance(root_rank, MPI.Comm):  # the older form: its comm was given
        given = comm
    _matched(
        given,
        process_set,
        "broadcast_optimizer_state",
        [root],
        lambda: _state(optimizer, root, comm),
    )


def _state(optimizer, root: int, comm) -> None:
    """Broadcast ``optimizer``'s state structure, then its state, from ``root`` over ``comm``."""
    with ParamSync(comm, root=root) as syncer:

        def exchange(world, call):
            error, mine, payload = "", {}, b""
            try:
                mine = _describe(optimizer)
                payload = _json.dumps(mine).encode()  # in root's order: the others take it
            except Exception as exc:
                error = f"cannot read the optimizer's state: {type(exc).__name__}: {exc}"
            _agree_on_local_errors(world, error, call)
            described = _json.loads(
                _broadcast_bytes(world, payload if world.rank == root else b"", root, call)
            )
            # Building root's structure can fail here alone (a dtype this torch lacks, a device
            # this rank has not): agreed again, so no rank goes on into sync_state by itself.
            tree, error = None, ""
            try:
                tree = (
                    optimizer.state_dict()
                    if mine == described
                    else _skeleton(optimizer, described, mine)
                )
            except Exception as exc:
                error = (
                    f"cannot build root's optimizer state structure: {type(exc).__name__}: {exc}"
                )
            _agree_on_local_errors(world, error, call)
            return tree

        tree = syncer._collective_exchange("optimizer structure exchange", [], exchange)
    optimizer.load_state_dict(sync_state(tree, comm, root=root))
