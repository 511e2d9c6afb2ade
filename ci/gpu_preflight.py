"""Preflight probes of ci/gpu-check.sh.

python ci/gpu_preflight.py mpi   (also under mpiexec) which MPI every rank loaded: rank 0 prints
                                 "size N | <library> | <path> | the wheel's MPICH on every rank"
                                 when each rank's library lies under $MPISYNC_CHECK_LIBDIR
python ci/gpu_preflight.py gpu   CuPy and torch see a GPU, a CuPy kernel compiles: one line per
                                 library, a line starting with ``FAIL`` for each problem, exit
                                 status 1 when there is any (a library that is not installed is
                                 no problem as long as the other one sees a GPU)
"""

import os
import sys

import numpy as np


def cupy_lines() -> tuple:
    """``(lines, failures, sees_gpu)`` for CuPy."""
    try:
        import cupy
    except ImportError:
        return ["cupy: not installed"], [], False
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return [], [f"FAIL cupy {cupy.__version__} sees no GPU: {type(exc).__name__}: {exc}"], False
    if count < 1:
        return [], [f"FAIL cupy {cupy.__version__} sees no GPU (0 devices)"], False
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    name = name.decode() if isinstance(name, bytes) else name
    lines = [
        f"cupy {cupy.__version__}: {count} device(s), device 0 {name}, CUDA runtime "
        f"{cupy.cuda.runtime.runtimeGetVersion()}"
    ]
    try:  # what mpisync's bucket pack compiles at run time (NVRTC), and a plain elementwise kernel
        parts = [cupy.arange(n, dtype=cupy.uint8) for n in (3, 5, 7)]
        out = cupy.empty(15, dtype=cupy.uint8)
        cupy.concatenate(parts, out=out)
        twice = cupy.ElementwiseKernel("T x", "T y", "y = x + x", "mpisync_preflight_twice")(out)
        want = np.concatenate([np.arange(n, dtype=np.uint8) for n in (3, 5, 7)])
        if (
            out.get().tobytes() != want.tobytes()
            or twice.get().tobytes() != (want + want).tobytes()
        ):
            return lines, ["FAIL cupy kernels ran but returned wrong bytes"], True
        lines.append("cupy: kernels compile and run (NVRTC)")
    except Exception as exc:
        return (
            lines,
            [
                f"FAIL cupy cannot compile a kernel (NVRTC): {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}"
            ],
            True,
        )
    return lines, [], True


def torch_lines() -> tuple:
    """``(lines, failures, sees_gpu)`` for torch."""
    try:
        import torch
    except ImportError:
        return ["torch: not installed"], [], False
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return (
            [],
            [
                f"FAIL torch {torch.__version__} sees no CUDA device (built for CUDA "
                f"{torch.version.cuda})"
            ],
            False,
        )
    x = torch.arange(1000, device="cuda:0", dtype=torch.float32)
    total = float(x.sum().item())
    if total != 499500.0:
        return [], [f"FAIL torch on cuda:0 summed 0..999 to {total}"], True
    pinned = torch.empty(16, dtype=torch.uint8, pin_memory=True)
    return (
        [
            f"torch {torch.__version__}: {torch.cuda.device_count()} CUDA device(s), "
            f"cuda:0 {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}, pinned memory "
            f"{pinned.is_pinned()}"
        ],
        [],
        True,
    )


def mpi_main() -> int:
    """Rank 0 prints the job's size and whether every rank loaded the MPI under the expected
    folder."""
    from mpi4py import MPI

    from mpisync.devices.detect import mpi_library_path

    comm = MPI.COMM_WORLD
    path = os.path.realpath(mpi_library_path() or "?")
    version = " ".join(MPI.Get_library_version().splitlines()[0].split())
    expected = os.environ["MPISYNC_CHECK_LIBDIR"].rstrip("/") + "/"
    every = np.array(
        [int(version.startswith("MPICH") and path.startswith(expected))], dtype=np.int64
    )
    comm.Allreduce(MPI.IN_PLACE, every, op=MPI.MIN)
    if comm.rank == 0:
        verdict = (
            "the wheel's MPICH on every rank" if every[0] else f"NOT {expected}* on every rank"
        )
        print(f"size {comm.size} | {version} | {path} | {verdict}")
    return 0


def gpu_main() -> int:
    """Print the lines; 0 when every installed library sees a GPU and CuPy compiles kernels."""
    lines, failures, seen = [], [], []
    for probe in (cupy_lines, torch_lines):
        probe_lines, probe_failures, sees = probe()
        lines += probe_lines
        failures += probe_failures
        seen.append(sees)
    if not any(seen) and not failures:
        failures.append("FAIL neither CuPy nor torch is installed: nothing to test on the GPU")
    for line in lines + failures:
        print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit({"mpi": mpi_main, "gpu": gpu_main}[sys.argv[1]]())
