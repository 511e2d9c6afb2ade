"""Horovod's PyTorch API over MPI: ``import mpisync.horovod as hvd`` in place of
``import horovod.torch as hvd``, and the rest of the script runs unchanged.

    hvd.init()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

Launched as any MPI program (``mpiexec -n 4 python train.py``, ``srun --mpi=pmi2``,
``horovodrun --mpi``). Operations run at once, in calling order, the same on every rank; errors
are mpisync's (the same on every rank, none hangs). What Horovod has and this module does not
(Adasum, process sets, ``join``, elastic training, alltoall, reducescatter, TensorFlow, Keras,
MXNet) is an error naming it. docs/cli.md ("Coming from Horovod") lists every name.
"""

from __future__ import annotations

from .broadcast import broadcast_optimizer_state, broadcast_parameters
from .compression import Compression
from .context import (
    cross_rank,
    cross_size,
    global_process_set,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from .ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    broadcast_object,
    grouped_allreduce,
    grouped_allreduce_,
    poll,
    synchronize,
)
from .optimizer import DistributedOptimizer

__all__ = [
    "init",
    "shutdown",
    "is_initialized",
    "rank",
    "size",
    "local_rank",
    "local_size",
    "cross_rank",
    "cross_size",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "cuda_built",
    "rocm_built",
    "global_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "Compression",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "allgather",
    "allgather_async",
    "allgather_object",
    "barrier",
    "synchronize",
    "poll",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "DistributedOptimizer",
]


def mpi_enabled() -> bool:
    """Always: mpisync is MPI."""
    return True


def mpi_built() -> bool:
    """Always: mpisync is MPI."""
    return True


def gloo_enabled() -> bool:
    """Never: mpisync has no Gloo controller."""
    return False


def gloo_built() -> bool:
    """Never: mpisync has no Gloo controller."""
    return False


def nccl_built() -> int:
    """0: CUDA tensors go through MPI (staged or CUDA-aware), not NCCL."""
    return 0


def cuda_built() -> bool:
    """Whether torch sees CUDA (mpisync moves CUDA tensors through MPI; docs/gpu.md)."""
    import torch

    return bool(torch.cuda.is_available())


def rocm_built() -> bool:
    """Never."""
    return False


# Horovod names this module does not provide, with what to use instead.
_NOT_PROVIDED = {
    "elastic": "elastic training (hvd.elastic): restart the job from a checkpoint instead "
    "(mpisync stage-checkpoint)",
    "join": "hvd.join() for uneven inputs: give every rank the same number of batches "
    "(DistributedSampler(drop_last=True))",
    "alltoall": "alltoall: use the mpisync torch.distributed backend's all_to_all",
    "alltoall_async": "alltoall: use the mpisync torch.distributed backend's all_to_all",
    "reducescatter": "reducescatter: use the mpisync torch.distributed backend's reduce_scatter",
    "reducescatter_async": "reducescatter: use the mpisync torch.distributed backend's "
    "reduce_scatter",
    "grouped_reducescatter": "reducescatter: use the mpisync torch.distributed backend's "
    "reduce_scatter",
    "sparse_allreduce_async": "sparse all-reduce: reduce dense tensors "
    "(DistributedOptimizer(sparse_as_dense=True))",
    "ProcessSet": "process sets: hvd.init(comm) takes any mpi4py communicator",
    "add_process_set": "process sets: hvd.init(comm) takes any mpi4py communicator",
    "remove_process_set": "process sets: hvd.init(comm) takes any mpi4py communicator",
    "SyncBatchNorm": "hvd.SyncBatchNorm: use torch.nn.SyncBatchNorm with DDP on the mpisync "
    "torch.distributed backend",
    "start_timeline": "Horovod's timeline: set MPISYNC_TIMELINE=/path/tl-{rank}.json",
    "stop_timeline": "Horovod's timeline: set MPISYNC_TIMELINE=/path/tl-{rank}.json",
    "tensorflow": "TensorFlow: mpisync.horovod is Horovod's PyTorch API only",
    "keras": "Keras: mpisync.horovod is Horovod's PyTorch API only",
    "mxnet": "MXNet: mpisync.horovod is Horovod's PyTorch API only",
    "spark": "horovod.spark: launch with mpiexec or srun --mpi=pmi2",
    "ray": "horovod.ray: launch with mpiexec or srun --mpi=pmi2",
}


def __getattr__(name: str):
    if name in _NOT_PROVIDED:
        raise AttributeError(f"mpisync.horovod does not provide {_NOT_PROVIDED[name]}")
    raise AttributeError(f"module 'mpisync.horovod' has no attribute {name!r}")
