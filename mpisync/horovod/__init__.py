"""Horovod's PyTorch API over MPI: ``import mpisync.horovod as hvd`` in place of
``import horovod.torch as hvd``, and the rest of the script runs unchanged.

    hvd.init()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Launched as any MPI program (``mpiexec -n 4 python train.py``, ``srun --mpi=pmi2``,
``horovodrun --mpi``); a script that keeps ``import horovod.torch as hvd`` runs unchanged under
``mpiexec -n 4 python -m mpisync.horovod train.py`` (:mod:`mpisync.horovod.runner`).
Collectives (allreduce, allgather, broadcast, alltoall, reducescatter, their grouped and
``*_async`` forms, barrier, join) match by name across ranks as in Horovod
(:mod:`mpisync.horovod.engine`), run on process sets (MPI sub-communicators), and are
differentiable with Horovod's gradients. ``op=Adasum`` is Horovod's adaptive summation, with
its algorithm and its restrictions (:mod:`mpisync.horovod.adasum`; ``DistributedOptimizer``'s
Adasum form is :mod:`mpisync.horovod.adasum_optimizer`). Ranks that disagree get the same
:class:`HorovodInternalError` (a ``RuntimeError`` and an :class:`mpisync.SyncError`); bad
arguments the same :class:`HorovodArgumentError` (a ``ValueError``). What Horovod has and this
module does not (elastic training, the timeline API, TensorFlow, Keras, MXNet) is an error
naming it. docs/horovod.md lists every name.

Besides the functions and classes below: ``Average``, ``Sum``, ``Adasum``, ``Min``, ``Max`` and
``Product`` are the ``op`` values, with Horovod's numbers; ``global_process_set``
is the :class:`ProcessSet` of every rank of :func:`init`'s communicator, the default
``process_set``.
"""

from __future__ import annotations

from . import build_info as _build_info
from . import context as _context
from . import object_ops as _object_ops
from . import ops as _ops
from . import process_sets as _process_sets
from .build_info import *  # noqa: F403
from .compression import Compression
from .context import *  # noqa: F403
from .errors import HorovodArgumentError, HorovodInternalError
from .object_ops import *  # noqa: F403
from .ops import *  # noqa: F403
from .ops import DIFFERENTIABLE
from .optimizer import DistributedOptimizer
from .process_sets import *  # noqa: F403
from .state_broadcast import broadcast_optimizer_state, broadcast_parameters

__all__ = [
    *_context.__all__,
    *_build_info.__all__,
    *_process_sets.__all__,
    *_ops.__all__,
    *DIFFERENTIABLE,
    *_object_ops.__all__,
    "Compression",
    "HorovodInternalError",
    "HorovodArgumentError",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "DistributedOptimizer",
    "SyncBatchNorm",  # noqa: F405 - imported at first use (it needs torch)
]

# Horovod names this module does not provide, with what to use instead.
_NOT_PROVIDED = {
    "elastic": "elastic training (hvd.elastic): restart the job from a checkpoint instead "
    "(mpisync stage-checkpoint)",
    "start_timeline": "Horovod's timeline: set MPISYNC_TIMELINE=/path/tl-{rank}.json",
    "stop_timeline": "Horovod's timeline: set MPISYNC_TIMELINE=/path/tl-{rank}.json",
    "tensorflow": "TensorFlow: mpisync.horovod is Horovod's PyTorch API only",
    "keras": "Keras: mpisync.horovod is Horovod's PyTorch API only",
    "mxnet": "MXNet: mpisync.horovod is Horovod's PyTorch API only",
    "spark": "horovod.spark: launch with mpiexec or srun --mpi=pmi2",
    "ray": "horovod.ray: launch with mpiexec or srun --mpi=pmi2",
}


def __dir__() -> list[str]:
    # the lazily imported names too, so that dir(), completion and autodoc list them
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str):
    if name in DIFFERENTIABLE:
        from . import autograd

        return getattr(autograd, name)
    if name == "SyncBatchNorm":
        from .sync_batch_norm import SyncBatchNorm

        return SyncBatchNorm
    if name in _NOT_PROVIDED:
        raise AttributeError(f"mpisync.horovod does not provide {_NOT_PROVIDED[name]}")
    raise AttributeError(f"module 'mpisync.horovod' has no attribute {name!r}")
