"""What ``verify=True`` costs: the digest's speed on one core, and a verified repeated sync beside
an unverified one.

    python benchmarks/verify_cost.py digests
    mpiexec -n 2 python benchmarks/verify_cost.py sync [--library torch] [--iterations 15]

``digests``: GB/s of each candidate digest over about 100 MB of float32 in 160 arrays, one array
at a time as ``verify`` reads them, candidates interleaved, median of 7; a numpy copy of the same
bytes is the memory's own pace. ``sync``: a ``ParamSync`` repeats its sync of the ResNet-50 layout
(``mpisync.tools.workloads``), verify off and on alternating, after a warm-up of both; the slowest
rank's time per sync, medians. Only the public API is used, so the same script measures another
checkout put first on ``PYTHONPATH`` (old and new side by side: alternate the runs).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
import zlib

import numpy as np


def _arrays(total_bytes: int = 100_000_000, count: int = 160) -> list:
    rng = np.random.default_rng(0)
    weights = rng.integers(1, 300_000, count)
    sizes = (weights * (total_bytes // 4 / weights.sum())).astype(int)
    return [rng.standard_normal(n).astype(np.float32) for n in sizes]


def digests(args) -> None:
    import xxhash

    arrays = _arrays()
    total = sum(a.nbytes for a in arrays)
    copies = {id(a): np.empty_like(a) for a in arrays}
    candidates = {
        "BLAKE2b-128 (hashlib)": lambda a: hashlib.blake2b(a, digest_size=16).digest(),
        "XXH3-64 (xxhash)": xxhash.xxh3_64_digest,
        "XXH3-128 (xxhash)": xxhash.xxh3_128_digest,
        "CRC-32 (zlib)": zlib.crc32,
        "Adler-32 (zlib)": zlib.adler32,
        "numpy copy (reference)": lambda a: np.copyto(copies[id(a)], a),
    }
    times: dict = {name: [] for name in candidates}
    for _ in range(args.repeat):
        for name, digest in candidates.items():
            start = time.perf_counter()
            for array in arrays:
                digest(array)
            times[name].append(time.perf_counter() - start)
    print(f"{len(arrays)} arrays, {total / 1e6:.1f} MB, one core, median of {args.repeat}")
    for name, spent in times.items():
        median = statistics.median(spent)
        print(f"{name:24s} {median * 1e3:8.2f} ms {total / median / 1e9:7.2f} GB/s")


def sync(args) -> None:
    from mpi4py import MPI

    import mpisync
    from mpisync.tools.workloads import make_params, workload

    comm = MPI.COMM_WORLD
    params = make_params(workload("resnet50"), comm.rank, args.library)
    times: dict = {False: [], True: []}
    with mpisync.ParamSync(comm) as syncer:
        for verify in (False, True, False, True):  # prepare, bind, first digests
            report = syncer.sync(params, verify=verify)
        for _ in range(args.iterations):
            for verify in (False, True):
                comm.Barrier()
                start = time.perf_counter()
                syncer.sync(params, verify=verify)
                times[verify].append(time.perf_counter() - start)
    slowest = {v: [max(t) for t in zip(*comm.allgather(spent))] for v, spent in times.items()}
    if comm.rank == 0:
        off, on = statistics.median(slowest[False]), statistics.median(slowest[True])
        print(
            f"{mpisync.__file__}: {args.library} resnet50, {report.tensors} tensors, "
            f"{report.bytes / 1e6:.1f} MB, {comm.size} ranks, {report.channel}: "
            f"verify off {off * 1e3:.2f} ms, on {on * 1e3:.2f} ms, on/off {on / off:.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("digests", help="GB/s of each candidate digest on one core")
    p.add_argument("--repeat", type=int, default=7)
    p.set_defaults(run=digests)
    p = sub.add_parser("sync", help="a repeated ParamSync.sync, verify off and on (mpiexec)")
    p.add_argument("--library", choices=("numpy", "torch"), default="torch")
    p.add_argument("--iterations", type=int, default=15)
    p.set_defaults(run=sync)
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
