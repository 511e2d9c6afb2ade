"""DDP's one-time sync of a module's parameters and buffers, on an mpisync group, by
:func:`mpisync.sync_params`.

``DistributedDataParallel`` makes every rank's module state rank 0's when it is built (and its
``join`` makes the final model the last joiner's) through
``torch.distributed.utils._sync_params_and_buffers``, which joins the tensors into new buckets of
up to 250 MiB, broadcasts each and copies the result back: the join into new memory and the copy
back cost more than the broadcast (figures: docs/allreduce.md, "DDP's start-up sync").
``import mpisync.torch`` routes that function, on an mpisync group, to ``sync_params`` over the
group's ranks when every rank's tensors are contiguous dense CPU tensors of their own memory
(the ranks agree on that first); any other call (another backend's group, a GPU tensor, tensors
that share memory or are not contiguous on some rank) goes to torch's own.
``MPISYNC_TORCH_SYNC_PARAMS=0`` (read when a group is made, the same on every rank) keeps torch's
on that group.
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
    ``process_group``) on every rank; by :func:`mpisync.sync_params` on an mpisync group whose
    ranks' tensors all suit it (:func:`_takes`), else by torch's own."""
    group = _ours(process_group, module_states)
    if group is not None:
        comm, timeout = group._state_communicator()
        if not _on_every_rank(comm, _takes(module_states), timeout):
            group = None
    if group is None:
        _torch_sync(process_group, module_states, broadcast_bucket_size, src)
        return
    # names that sort in the list's order: the sync's order is torch's
    width = len(str(len(module_states)))
    named = {f"{i:0{width}d}": t for i, t in enumerate(module_states)}
    sync_params(named, comm, root=src, timeout=timeout)


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
    return bool(everyone[0])
