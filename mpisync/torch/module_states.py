"""DDP's one-time sync of a module's parameters and buffers, on an mpisync group, by
:func:`mpisync.sync_params`.

``DistributedDataParallel`` makes every rank's module state rank 0's when it is built (and its
``join`` makes the final model the last joiner's) through
``torch.distributed.utils._sync_module_states``, which lists the module's parameters and buffers
for ``_sync_params_and_buffers``; that joins the tensors into new buckets of up to 250 MiB,
broadcasts each and copies the result back: the join into new memory and the copy back cost more
than the broadcast (figures: docs/allreduce.md, "DDP's start-up sync").
``import mpisync.torch`` routes both functions, on an mpisync group, to ``sync_params`` over the
group's ranks when every rank's tensors are contiguous dense CPU tensors of their own memory
(the ranks agree on that first); any other call (another backend's group, a GPU tensor, tensors
that share memory or are not contiguous on some rank) goes to torch's own. The tensors keep the
module's own names (``0.weight``, ``1.running_mean``), so that a parameter or buffer that differs
between ranks is named as the module names it.
``MPISYNC_TORCH_SYNC_PARAMS=0`` (read when a group is made, the same on every rank) keeps torch's
on that group.

The sync waits for the collectives issued on the group before it (which may write the module's
tensors), never for the group's point-to-point operations: a receive posted before DDP is built
may be matched only by a send its peer makes after.
"""

from __future__ import annotations

import numpy as _np
import torch
import torch.distributed.utils as _utils
from mpi4py import MPI

from .._runtime.clock import Deadline
from .._runtime.keepalive import keep_alive
from .._runtime.ring import Expired
from .._runtime.timeouts import timed_out
from ..errors import InvalidParamError, ManifestMismatchError
from ..sync import sync_params
from .op import overlapping
from .process_group import ProcessGroupMPISync

__all__ = ["install"]

# torch's own sync; None where this torch has none of that name (nothing is then replaced)
_torch_sync = getattr(_utils, "_sync_params_and_buffers", None)


def install() -> None:
    """Route torch's module-state sync through :func:`_sync_module_states` and
    :func:`_sync_params_and_buffers` (idempotent). Where torch has not both names (in
    ``torch.distributed.utils`` and DDP's module), nothing is replaced: DDP then syncs through
    the group's broadcasts, as on any backend."""
    import torch.nn.parallel.distributed as _ddp  # DDP calls the name it imported

    if not replaceable(_utils, _ddp):
        return
    _utils._sync_params_and_buffers = _sync_params_and_buffers
    _utils._sync_module_states = _sync_module_states
    _ddp._sync_module_states = _sync_module_states


def replaceable(utils, ddp) -> bool:
    """Whether torch's module-state sync has the names :func:`install` replaces."""
    return all(
        callable(getattr(module, name, None))
        for module, name in (
            (utils, "_sync_params_and_buffers"),
            (utils, "_sync_module_states"),
            (ddp, "_sync_module_states"),
        )
    )


def _sync_module_states(
    module,
    process_group,
    broadcast_bucket_size,
    src,
    params_and_buffers_to_ignore,
    broadcast_buffers: bool = True,
) -> None:
    """torch's ``_sync_module_states``: the same tensors, in the same order, synced as
    :func:`_sync_params_and_buffers` does, under the module's names for them."""
    named = [
        (name, param.detach())
        for name, param in module.named_parameters()
        if name not in params_and_buffers_to_ignore
    ]
    if broadcast_buffers:
        named += [
            (name, buffer.detach())
            for name, buffer in module.named_buffers()
            if name not in params_and_buffers_to_ignore
        ]
    states = [tensor for _, tensor in named]
    _sync(process_group, states, broadcast_bucket_size, src, [name for name, _ in named])


def _sync_params_and_buffers(process_group, module_states: list, broadcast_bucket_size, src):
    """torch's ``_sync_params_and_buffers``: ``module_states`` made ``src``'s (a rank of
    ``process_group``) on every rank; by :func:`mpisync.sync_params` on an mpisync group whose
    ranks' tensors all suit it (:func:`_takes`), else by torch's own."""
    # names that sort in the list's order: the sync's order is torch's
    width = len(str(len(module_states)))
    names = [f"{i:0{width}d}" for i in range(len(module_states))]
    _sync(process_group, module_states, broadcast_bucket_size, src, names)


def _sync(process_group, module_states: list, broadcast_bucket_size, src, names: list) -> None:
    """``module_states`` (named ``names``) made ``src``'s on every rank of ``process_group``."""
    group = _ours(process_group, module_states)
    if group is not None:
        comm, timeout = group._state_communicator()
        try:
            takes = _on_every_rank(comm, _takes(module_states), timeout)
        except BaseException:
            group._break_states("DDP's module-state sync did not complete")
            raise
        if not takes:
            group = None
    if group is None:
        assert _torch_sync is not None  # install() replaced nothing otherwise
        _torch_sync(process_group, module_states, broadcast_bucket_size, src)
        return
    try:
        sync_params(dict(zip(names, module_states)), comm, root=src, timeout=timeout)
    except (ManifestMismatchError, InvalidParamError):
        raise  # refused on every rank, before anything moved: the group goes on
    except BaseException:
        group._break_states("DDP's module-state sync did not complete")
        raise


def _ours(process_group, tensors: list) -> ProcessGroupMPISync | None:
    """The mpisync group that may sync ``tensors`` by ``sync_params``, or None (another backend,
    the switch off, or no tensors): what every rank of the group answers alike."""
    if not isinstance(process_group, ProcessGroupMPISync) or not process_group._syncs_states:
        return None
    return process_group if tensors else None


def _takes(tensors: list) -> bool:
    """Whether ``sync_params`` takes ``tensors`` where they lie: contiguous dense CPU tensors,
    none sharing memory with another. A module may be laid out differently on one rank (a
    channels-last convolution there only), so the ranks agree on it before either way is
    taken."""
    return all(_plain(t) for t in tensors) and not overlapping(tensors)


def _plain(tensor: torch.Tensor) -> bool:
    return (
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and not tensor.is_quantized
        and not (tensor.is_neg() or tensor.is_conj())  # no byte view holds their values
    )


def _on_every_rank(comm, mine: bool, timeout: float | None) -> bool:
    """Whether ``mine`` is true on every rank of ``comm`` (one all-reduce, within ``timeout``)."""
    flag, everyone = _np.array([int(mine)], _np.int64), _np.zeros(1, _np.int64)
    request = comm.Iallreduce(flag, everyone, MPI.MIN)
    try:
        Deadline(timeout, comm=comm).wait(request)
    except Expired:
        keep_alive(request, flag, everyone)
        timed_out(comm, "DDP's module-state sync", ["agreement"], timeout)
    except BaseException:  # an interrupt: MPI may still write into the buffers
        keep_alive(request, flag, everyone)
        raise
    return bool(everyone[0])
