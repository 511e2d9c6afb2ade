"""Is the loaded MPI CUDA-aware? Only a positive answer from the library counts.

Passing device pointers to an MPI that is not CUDA-aware crashes the process,
so ``gpu_transport="auto"`` goes direct only when the library says yes:
Open MPI's ``MPIX_Query_cuda_support()``, MPICH's
``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)`` (and not disabled by
``MPIR_CVAR_ENABLE_GPU=0``), or an MPI-4.1 ``mpi_memory_alloc_kinds`` info key
on ``COMM_WORLD`` that lists ``cuda``.
"""

from __future__ import annotations

import ctypes as _ctypes
import functools as _functools
import os as _os

from mpi4py import MPI

from .._runtime.mpilib import library_name

__all__ = ["cuda_aware_mpi", "choose_transport", "gpus_seen", "mpi_library_path"]

_MPIX_GPU_SUPPORT_CUDA = 0


def mpi_library_path() -> str | None:
    """The MPI shared library this process loaded (from ``/proc/self/maps``), if it can be told."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line and ".so" in line}
    except OSError:
        return None
    preferred = sorted(
        p for p in paths if _os.path.basename(p).startswith(("libmpi.so", "libmpich.so"))
    )
    candidates = preferred or sorted(paths)
    return candidates[0] if candidates else None


@_functools.lru_cache(maxsize=1)
def cuda_aware_mpi() -> tuple:
    """``(True or False, why)``: whether the loaded MPI says it handles CUDA device buffers."""
    reasons = []
    path = mpi_library_path()
    library = None
    if path is not None:
        try:
            library = _ctypes.CDLL(path)
        except OSError as exc:
            reasons.append(f"could not open {path}: {exc}")
    else:
        reasons.append("the MPI library's path is unknown")
    version = MPI.Get_library_version()
    vendor = library_name(version).rsplit(" ", 1)[0]  # "MPICH", "Open MPI", "Intel MPI"
    if library is not None and hasattr(library, "MPIX_GPU_query_support"):  # MPICH and derivatives
        if _os.environ.get("MPIR_CVAR_ENABLE_GPU", "").strip() == "0":
            return False, f"{vendor}: GPU support disabled by MPIR_CVAR_ENABLE_GPU=0"
        flag = _ctypes.c_int(0)
        rc = library.MPIX_GPU_query_support(_MPIX_GPU_SUPPORT_CUDA, _ctypes.byref(flag))
        return (
            rc == 0 and flag.value == 1,
            f"{vendor}: MPIX_GPU_query_support(CUDA) = {flag.value} ({path})",
        )
    if library is not None and hasattr(library, "MPIX_Query_cuda_support"):  # Open MPI
        answer = int(library.MPIX_Query_cuda_support())
        return answer == 1, f"{vendor}: MPIX_Query_cuda_support() = {answer} ({path})"
    try:
        kinds = MPI.COMM_WORLD.Get_info().Get("mpi_memory_alloc_kinds")
    except Exception:  # an MPI before 4.1 has no such key
        kinds = None
    if kinds and "cuda" in kinds.lower():
        return True, f"mpi_memory_alloc_kinds = {kinds!r}"
    reasons.append(f"no CUDA query function in the library; mpi_memory_alloc_kinds = {kinds!r}")
    return False, "; ".join(reasons)


def choose_transport(setting: str) -> tuple:
    """``(transport, why)`` for device buffers given ``gpu_transport``: ``"staged"`` or
    ``"cuda-aware"``."""
    if setting == "staged":
        return "staged", "gpu_transport=staged"
    if setting == "cuda-aware":
        return (
            "cuda-aware",
            "gpu_transport=cuda-aware (forced: the MPI library must really be CUDA-aware)",
        )
    aware, why = cuda_aware_mpi()
    return ("cuda-aware" if aware else "staged"), why


def gpus_seen() -> str:
    """A line saying which GPU libraries are importable and how many devices each sees."""
    parts = []
    try:
        import cupy

        parts.append(f"cupy {cupy.__version__}: {cupy.cuda.runtime.getDeviceCount()} device(s)")
    except ImportError:
        parts.append("cupy not installed")
    except Exception as exc:  # installed without a driver or a device
        parts.append(f"cupy: no device ({type(exc).__name__})")
    try:
        import torch

        parts.append(f"torch {torch.__version__}: {torch.cuda.device_count()} CUDA device(s)")
    except ImportError:
        parts.append("torch not installed")
    return "; ".join(parts)
