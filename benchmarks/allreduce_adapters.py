"""The first all-reduce of 5000 small tensors through each adapter into the reduce groups, on
checkouts side by side.

    python benchmarks/allreduce_adapters.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 3] [--ranks 2]

Sets (5000 tensors each, ``op="avg"``): ``dict`` (one float32 array of 100 values per name: the
scan's adapter), ``lists`` (two float32 replicas per name: the general manifest's adapter, a local
reduce and a fan-out) and ``float16`` (200 values per name: the general adapter, staged through
float32). Each measurement is a fresh ``GradSync`` and its first ``allreduce`` (what a one-shot
call costs: manifest, agreement, plan, steps, collectives), the median of 7, the slowest rank's
time. Rounds alternate the checkouts (each needs its C extension built in place); the table
gives each checkout's median over rounds and the ratio new/old.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_SETS = ("dict", "lists", "float16")


def _make(kind: str) -> dict:
    import numpy as np

    if kind == "lists":
        return {
            f"t{i:04d}": [np.full(100, i % 7, np.float32), np.ones(100, np.float32)]
            for i in range(5000)
        }
    if kind == "float16":
        return {f"t{i:04d}": np.full(200, i % 7, np.float16) for i in range(5000)}
    return {f"t{i:04d}": np.full(100, i % 7, np.float32) for i in range(5000)}


def _measure() -> None:
    """Under mpiexec: one line ``set milliseconds`` per set, on rank 0."""
    from mpi4py import MPI

    import mpisync

    comm = MPI.COMM_WORLD
    for kind in _SETS:
        times = []
        for _ in range(7):
            params = _make(kind)
            comm.Barrier()
            start = time.perf_counter()
            with mpisync.GradSync(comm, op="avg") as syncer:
                syncer.allreduce(params)
            times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
        if comm.rank == 0:
            print(kind, statistics.median(times) * 1e3, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    opt = parser.parse_args()
    results: dict = {side: {kind: [] for kind in _SETS} for side in ("old", "new")}
    for round_ in range(opt.rounds):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for side in order:
            env = dict(os.environ, PYTHONPATH=os.path.abspath(getattr(opt, side)))
            out = subprocess.run(
                ["mpiexec", "-n", str(opt.ranks), sys.executable, __file__, "--measure"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            ).stdout
            for line in out.splitlines():
                kind, ms = line.split()
                results[side][kind].append(float(ms))
        print(f"round {round_ + 1}/{opt.rounds} done", file=sys.stderr)
    print(f"{'set':10} {'old ms':>10} {'new ms':>10} {'new/old':>8}")
    for kind in _SETS:
        old = statistics.median(results["old"][kind])
        new = statistics.median(results["new"][kind])
        print(f"{kind:10} {old:10.2f} {new:10.2f} {new / old:8.3f}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--measure"]:
        _measure()
        sys.exit(0)
    sys.exit(main())
