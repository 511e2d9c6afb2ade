"""GPU staging figures for ci/gpu-check.sh: pinned copies, host Bcast, staged syncs (run at 2
ranks).

    mpiexec -n 2 python benchmarks/gpu_bench.py [--library torch|cupy]

Prints a table on rank 0: pinned D2H and H2D bandwidth of 1 GiB, a host Bcast of
1 GiB of pinned memory, then staged (and, if the MPI is CUDA-aware, direct)
syncs of one 1 GiB tensor and of the ResNet-50 parameter set, the seed's own
path for that set (per tensor: copy to host, Bcast, copy back), and two ratios:
the 1 GiB staged sync against min(D2H, Bcast, H2D) (target >= 0.8) and the
staged ResNet-50 sync against the seed's path (target >= 1.5).

The array library is torch when it sees a CUDA device, else CuPy (or the one
``--library`` names); neither is imported unless it is used.
"""

import argparse
import importlib.util

import numpy as np
from mpi4py import MPI

import mpisync
from mpisync.devices.detect import choose_transport
from mpisync.tools.bench.timing import measure
from mpisync.tools.workloads import workload

N = 1 << 30


class TorchLib:
    """The few device operations the bench needs, with torch CUDA tensors."""

    name = "torch"

    def __init__(self, rank):
        import torch

        self.torch = torch
        self.device = rank % torch.cuda.device_count()
        torch.cuda.set_device(self.device)
        self.device_name = torch.cuda.get_device_name(self.device)

    def empty(self, n):
        return self.torch.empty(n, dtype=self.torch.uint8, device=f"cuda:{self.device}")

    def pinned(self, n):
        tensor = self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)
        return tensor, tensor.numpy()

    def copy(self, dst, src):
        dst.copy_(src, non_blocking=True)
        self.torch.cuda.synchronize()

    def full(self, shape, value, dtype):
        return self.torch.full(
            shape, value, dtype=getattr(self.torch, dtype), device=f"cuda:{self.device}"
        )

    def to_host(self, tensor):
        return tensor.cpu().numpy()

    def from_host(self, tensor, host):
        tensor.copy_(self.torch.from_numpy(host))

    def synchronize(self):
        self.torch.cuda.synchronize()


class CupyLib:
    """The same operations with CuPy arrays (raw copies on the null stream)."""

    name = "cupy"

    def __init__(self, rank):
        import cupy

        self.cp = cupy
        self.device = rank % cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(self.device).use()
        name = cupy.cuda.runtime.getDeviceProperties(self.device)["name"]
        self.device_name = name.decode() if isinstance(name, bytes) else name

    def empty(self, n):
        return self.cp.empty(n, dtype=self.cp.uint8)

    def pinned(self, n):
        memory = self.cp.cuda.alloc_pinned_memory(n)
        return memory, np.frombuffer(memory, np.uint8, n)

    def copy(self, dst, src):
        rt = self.cp.cuda.runtime
        dst_ptr = dst.data.ptr if isinstance(dst, self.cp.ndarray) else dst.ptr
        src_ptr = src.data.ptr if isinstance(src, self.cp.ndarray) else src.ptr
        rt.memcpyAsync(dst_ptr, src_ptr, N, rt.memcpyDefault, 0)
        rt.deviceSynchronize()

    def full(self, shape, value, dtype):
        return self.cp.full(shape, value, dtype=dtype)

    def to_host(self, array):
        return array.get()

    def from_host(self, array, host):
        array.set(host)

    def synchronize(self):
        self.cp.cuda.runtime.deviceSynchronize()


def _torch_sees_gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def open_library(choice, rank):
    """The library asked for, else torch when it sees a GPU, else CuPy."""
    if choice == "torch" or (choice is None and _torch_sees_gpu()):
        return TorchLib(rank)
    if choice in (None, "cupy") and importlib.util.find_spec("cupy") is not None:
        return CupyLib(rank)
    raise SystemExit("gpu_bench: needs torch with CUDA or CuPy")


def seed_path(comm, lib, params):
    """The seed's sync: per tensor, copy to host, Bcast, copy back (pageable host memory)."""

    def run():
        for tensor in params.values():
            host = lib.to_host(tensor)  # C-contiguous, the tensor's shape (0-d included)
            comm.Bcast(host.reshape(-1).view(np.uint8), 0)
            if comm.rank != 0:
                lib.from_host(tensor, host)
        lib.synchronize()

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--library", choices=("torch", "cupy"), help="default: torch if it sees a GPU, else CuPy"
    )
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    lib = open_library(args.library, comm.rank)

    dev = lib.empty(N)
    pinned, host = lib.pinned(N)
    d2h = measure(comm, lambda: lib.copy(pinned, dev), iterations=5, warmup=1).median
    h2d = measure(comm, lambda: lib.copy(dev, pinned), iterations=5, warmup=1).median
    bcast = measure(comm, lambda: comm.Bcast(host, 0), iterations=5, warmup=1).median
    rows = [
        ("pinned D2H, 1 GiB", d2h, N),
        ("pinned H2D, 1 GiB", h2d, N),
        ("host Bcast of pinned, 1 GiB", bcast, N),
    ]
    pinned = host = None  # the pinned buffers go before the syncs

    transports = ["staged"] + (
        ["cuda-aware"] if choose_transport("auto")[0] == "cuda-aware" else []
    )
    resnet = {
        n: lib.full(s, float(comm.rank), "float32") if d == "float32" else lib.full(s, 0, "int64")
        for n, (s, d) in workload("resnet50").items()
    }
    resnet_bytes = sum(int(t.nbytes) for t in resnet.values())
    staged = {}
    for transport in transports:
        with mpisync.ParamSync(comm, gpu_transport=transport) as syncer:
            t = measure(comm, lambda: syncer.sync({"w": dev}), iterations=5, warmup=1).median
            rows.append((f"{transport} sync, one 1 GiB tensor", t, N))
            staged.setdefault(transport, {})["1gib"] = t
        with mpisync.ParamSync(comm, gpu_transport=transport) as syncer:
            t = measure(comm, lambda: syncer.sync(resnet), iterations=7, warmup=2).median
            rows.append((f"{transport} sync, ResNet-50 ({len(resnet)} tensors)", t, resnet_bytes))
            staged[transport]["resnet"] = t
    seed = measure(comm, seed_path(comm, lib, resnet), iterations=5, warmup=1).median
    rows.append(("seed path, ResNet-50 (per tensor)", seed, resnet_bytes))

    if comm.rank == 0:

        def gbps(nbytes, seconds):
            return nbytes / seconds / 1e9

        library = " ".join(MPI.Get_library_version().splitlines()[0].split())
        transport, why = choose_transport("auto")
        print(
            f"mpisync GPU check: {comm.size} ranks, {lib.name} on {lib.device_name}, {library}; "
            f"transport auto -> {transport} ({why})"
        )
        print(f"{'measurement':<44} {'ms':>9} {'GB/s':>8}")
        for name, seconds, nbytes in rows:
            print(f"{name:<44} {seconds * 1e3:9.2f} {gbps(nbytes, seconds):8.2f}")
        floor = min(gbps(N, d2h), gbps(N, bcast), gbps(N, h2d))
        one = gbps(N, staged["staged"]["1gib"])
        print(
            f"staged 1 GiB / min(D2H, Bcast, H2D) = {one:.2f} / {floor:.2f} GB/s = "
            f"{one / floor:.2f} (target >= 0.8)"
        )
        ratio = seed / staged["staged"]["resnet"]
        print(f"staged ResNet-50 vs the seed's path: {ratio:.2f}x faster (target >= 1.5)")


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # one rank's failure must not leave the others waiting in a collective
        import traceback

        traceback.print_exc()
        MPI.COMM_WORLD.Abort(1)
