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
    """Whether Horovod was built with MPI: always, since mpisync runs on MPI (mpi4py).

    Args:
        verbose: Accepted for Horovod's signature; nothing is printed.

    Returns:
        ``True``; it needs no :func:`init`.

    Raises:
        TypeError: Only Python's own, for a call with other arguments; the query
            itself raises nothing.
    """
    return True


def mpi_enabled() -> bool:
    """Whether MPI is the controller in use: always (there is no other).

    Returns:
        ``True``, before :func:`init` too; it never raises.
    """
    return True


def gloo_built(verbose: bool = False) -> bool:
    """Whether Horovod's Gloo controller was built: never, mpisync has none.

    Args:
        verbose: Horovod's argument, unused here.

    Returns:
        ``False``, with or without :func:`init`.

    Raises:
        TypeError: Never from the query; only Python's for a wrong call.
    """
    return False


def gloo_enabled() -> bool:
    """Whether Gloo is the controller in use: never (``horovodrun --gloo`` has no
    counterpart; launch with ``mpiexec``).

    Returns:
        ``False``; no :func:`init` needed, never raises.
    """
    return False


def nccl_built(verbose: bool = False) -> int:
    """Horovod's NCCL version: 0, no NCCL. CUDA tensors go through MPI (staged through the
    host, or CUDA-aware MPI), not NCCL.

    Args:
        verbose: Kept from Horovod's signature; ignored.

    Returns:
        ``0``, Horovod's answer when built without NCCL.

    Raises:
        TypeError: For a call Python refuses (an unknown keyword); nothing else.
    """
    return 0


def ccl_built(verbose: bool = False) -> bool:
    """Whether Horovod was built with oneCCL: never.

    Args:
        verbose: Ignored, as there is nothing to report.

    Returns:
        ``False`` (mpisync has no oneCCL path).

    Raises:
        TypeError: Not raised by the query itself (only for a wrong call).
    """
    return False


def ddl_built(verbose: bool = False) -> bool:
    """Whether Horovod was built with IBM DDL: never.

    Args:
        verbose: Present for Horovod's signature only.

    Returns:
        ``False`` at all times.

    Raises:
        TypeError: Only when Python refuses the call's arguments.
    """
    return False


def cuda_built(verbose: bool = False) -> bool:
    """Whether CUDA tensors can be used: whether torch sees CUDA.

    Unlike Horovod, which answers how it was compiled, this asks torch at run time: mpisync
    has no CUDA build of its own (CUDA tensors travel through MPI, staged or CUDA-aware).

    Args:
        verbose: Unused (Horovod's parameter).

    Returns:
        ``torch.cuda.is_available()``.

    Raises:
        ModuleNotFoundError: torch is not installed.
    """
    import torch

    return bool(torch.cuda.is_available())


def rocm_built(verbose: bool = False) -> bool:
    """Whether Horovod was built with ROCm: never (mpisync has no ROCm path of its own).

    Args:
        verbose: Not used; Horovod's signature has it.

    Returns:
        ``False``.

    Raises:
        TypeError: From Python, for an unexpected argument; the answer itself cannot
            fail.
    """
    return False
