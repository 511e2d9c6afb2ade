"""DDP's one-time sync of a module's parameters and buffers, on an mpisync group, by
:func:`mpisync.sync_params`.

``DistributedDataParallel`` makes every rank's module state rank 0's when it is built (and its
``join`` makes the final model the last joiner's) through
``torch.distributed.utils._sync_params_and_buffers``, which joins the tensors into new buckets of
up to 250 MiB, broadcasts each and copies the result back. For a ResNet-50 (102 MB, 2 ranks) the
join into new memory alone took 46 ms and the whole 100 ms, where ``sync_params`` of the same
tensors took 13.5 ms (docs/allreduce.md, "DDP's start-up sync"). ``import mpisync.torch`` routes
that function, for CPU tensors on an mpisync group, to ``sync_params`` over the group's ranks;
any other call (another backend's group, a GPU tensor, tensors that share memory or are not
contiguous) goes to torch's own. ``MPISYNC_TORCH_SYNC_PARAMS=0`` (read when a group is made,
the same on every rank) keeps torch's on that group.
"""

from __future__ import annotations

import torch
import torch.distributed.utils as _utils

from ..sync import sync_params
from .op import overlapping
from .process_group import ProcessGroupMPISync

__all__ = ["install"]

_torch_sync = _utils._sync_params_and_buffers


def install() -> None:
    """Route torch's module-state sync through :func:`_sync_params_and_buffers` (idempotent)."""
    _utils._sync_params_and_buffers = _sync_params_and_buffers


def _sync_params_and_buffers(process_group, module_states: list, broadcast_bucket_size, src):
    """torch's ``_sync_params_and_buffers``: ``module_states`` made ``src``'s (a rank of
    ``process_group``) on every rank; by :func:`mpisync.sync_params` where
    :func:`_ours` says so, else by torch's own."""
    group = _ours(process_group, module_states)
    if group is None:
        _torch_sync(process_group, module_states, broadcast_bucket_size, src)
        return
    comm, timeout = group._state_communicator()
    # names that sort in the list's order: the sync's order is torch's
    width = len(str(len(module_states)))
    named = {f"{i:0{width}d}": t for i, t in enumerate(module_states)}
    sync_params(named, comm, root=src, timeout=timeout)


def _ours(process_group, tensors: list) -> ProcessGroupMPISync | None:
    """The mpisync group that syncs ``tensors``, or None: torch's own does (another backend, the
    switch off, an empty list, or a tensor that is not a contiguous dense CPU tensor of its own
    memory). Every input here is what the ranks agree on (the group, its switch, and DDP's
    tensors, whose shapes DDP checked on every rank first), so every rank answers alike."""
    if not isinstance(process_group, ProcessGroupMPISync) or not process_group._syncs_states:
        return None
    if not tensors or not all(_plain(t) for t in tensors) or overlapping(tensors):
        return None
    return process_group


def _plain(tensor: torch.Tensor) -> bool:
    return (
        tensor.device.type == "cpu"
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and not tensor.is_quantized
    )
