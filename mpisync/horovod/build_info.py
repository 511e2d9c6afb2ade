"""Horovod's ``*_built`` and ``*_enabled`` queries, answered for mpisync: MPI is built and
enabled; no Gloo, NCCL, oneCCL, DDL or ROCm; CUDA as torch sees it (CUDA tensors go through
MPI, staged or CUDA-aware: docs/gpu.md)."""

from __future__ import annotations

__all__ = [
    "mpi_built",
    "mpi_enabled",
    "gloo_built",
    "gloo_enabled",
    "nccl_built",
    "ccl_built",
    "ddl_built",
    "cuda_built",
    "rocm_built",
]


def mpi_built(verbose: bool = False) -> bool:
    """Always: mpisync is MPI."""
    return True


def mpi_enabled() -> bool:
    """Always: mpisync is MPI."""
    return True


def gloo_built(verbose: bool = False) -> bool:
    """Never: mpisync has no Gloo controller."""
    return False


def gloo_enabled() -> bool:
    """Never: mpisync has no Gloo controller."""
    return False


def nccl_built(verbose: bool = False) -> int:
    """0 (Horovod's answer without NCCL): CUDA tensors go through MPI."""
    return 0


def ccl_built(verbose: bool = False) -> bool:
    """Never: no oneCCL."""
    return False


def ddl_built(verbose: bool = False) -> bool:
    """Never: no IBM DDL."""
    return False


def cuda_built(verbose: bool = False) -> bool:
    """Whether torch sees CUDA."""
    import torch

    return bool(torch.cuda.is_available())


def rocm_built(verbose: bool = False) -> bool:
    """Never."""
    return False
