"""GPU staging figures for ci/gpu-check.sh: pinned copies, host Bcast, staged syncs (run at 2 ranks).

    mpiexec -n 2 python benchmarks/gpu_bench.py

Prints a table on rank 0: pinned D2H and H2D bandwidth of 1 GiB, a host Bcast of
1 GiB of pinned memory, then staged (and, if the MPI is CUDA-aware, direct)
syncs of one 1 GiB tensor and of the ResNet-50 parameter set, with the ratio of
the 1 GiB staged sync to min(D2H, Bcast, H2D) (target: >= 0.8).
"""

import numpy as np
import torch
from mpi4py import MPI

import mpisync
from mpisync.bench.timing import measure
from mpisync.devices.detect import choose_transport
from mpisync.workloads import workload

comm = MPI.COMM_WORLD
device = comm.rank % torch.cuda.device_count()
torch.cuda.set_device(device)
N = 1 << 30


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def timed_copy(dst, src):
    def run():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
    return measure(comm, run, iterations=5, warmup=1).median


dev = torch.empty(N, dtype=torch.uint8, device=f"cuda:{device}")
pinned = torch.empty(N, dtype=torch.uint8, pin_memory=True)
rows = []
d2h = timed_copy(pinned, dev)
h2d = timed_copy(dev, pinned)
host = pinned.numpy()
bcast = measure(comm, lambda: comm.Bcast(host, 0), iterations=5, warmup=1).median
rows += [("pinned D2H, 1 GiB", d2h, N), ("pinned H2D, 1 GiB", h2d, N), ("host Bcast of pinned, 1 GiB", bcast, N)]
del pinned, host

transports = ["staged"] + (["cuda-aware"] if choose_transport("auto")[0] == "cuda-aware" else [])
resnet = {n: torch.full(s, float(comm.rank), device=f"cuda:{device}") if d == "float32"
          else torch.zeros(s, dtype=torch.int64, device=f"cuda:{device}") for n, (s, d) in workload("resnet50").items()}
resnet_bytes = sum(t.numel() * t.element_size() for t in resnet.values())
staged_1gib = None
for transport in transports:
    with mpisync.ParamSync(comm, gpu_transport=transport) as syncer:
        t = measure(comm, lambda: syncer.sync({"w": dev}), iterations=5, warmup=1).median
        rows.append((f"{transport} sync, one 1 GiB tensor", t, N))
        staged_1gib = t if transport == "staged" else staged_1gib
    with mpisync.ParamSync(comm, gpu_transport=transport) as syncer:
        t = measure(comm, lambda: syncer.sync(resnet), iterations=7, warmup=2).median
        rows.append((f"{transport} sync, ResNet-50 ({len(resnet)} tensors)", t, resnet_bytes))
if comm.rank == 0:
    print(f"mpisync GPU check: {comm.size} ranks, {torch.cuda.get_device_name(device)}, "
          f"{MPI.Get_library_version().splitlines()[0]}; transport auto -> {choose_transport('auto')}")
    print(f"{'measurement':<40} {'ms':>9} {'GB/s':>8}")
    for name, seconds, nbytes in rows:
        print(f"{name:<40} {seconds * 1e3:9.2f} {gbps(nbytes, seconds):8.2f}")
    floor = min(gbps(N, d2h), gbps(N, bcast), gbps(N, h2d))
    print(f"staged 1 GiB / min(D2H, Bcast, H2D) = {gbps(N, staged_1gib):.2f} / {floor:.2f} = "
          f"{gbps(N, staged_1gib) / floor:.2f} (target >= 0.8)")
