"""mpisync as a torch.distributed backend.

``import mpisync.torch`` registers the backend ``"mpisync"``, and makes DDP's start-up sync
of a module's parameters and buffers on its groups a :func:`mpisync.sync_params`
(:mod:`mpisync.torch.module_states`); :func:`init_process_group` starts torch's default process
group on it with rank and size taken from MPI (no ``MASTER_ADDR``, ``RANK`` or ``WORLD_SIZE``).

>>> import mpisync.torch
>>> mpisync.torch.init_process_group()                        # doctest: +SKIP
>>> model = torch.nn.parallel.DistributedDataParallel(model)  # doctest: +SKIP
"""

from __future__ import annotations

from .backend import BACKEND_NAME, init_process_group
from .communicators import GroupTimeoutError
from .errors import (
    ArgumentError,
    CountError,
    MismatchError,
    OperationError,
    OperationTimeoutError,
    WaitTimeoutError,
)
from .module_states import install as _install_module_states
from .process_group import ProcessGroupMPISync

__all__ = [
    "BACKEND_NAME",
    "ProcessGroupMPISync",
    "init_process_group",
    "ArgumentError",
    "MismatchError",
    "CountError",
    "GroupTimeoutError",
    "OperationError",
    "OperationTimeoutError",
    "WaitTimeoutError",
]

_install_module_states()  # DDP's start-up sync on an mpisync group: sync_params
