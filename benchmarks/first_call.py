"""The first call's cost on sets the bench's rows do not hold, on checkouts side by side: the
all-reduce through each adapter into the reduce groups, and the device steps' compile.

    python benchmarks/first_call.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 3] [--ranks 2]

All-reduce sets (``op="avg"``): ``dict`` (5000 float32 arrays of 100 values: the scan's
adapter), ``lists`` (5000 names, two float32 replicas each: the general manifest's adapter, a
local reduce and a fan-out), ``float16`` (5000 arrays of 200 values: the general adapter, staged
through float32) and ``staged`` (2000 names, two float32 replicas of 100 values each on two
simulated devices: staged through host buffers). Each is a fresh ``GradSync`` and its first
``allreduce`` (manifest, agreement, plan, steps, collectives), the median of 7, the slowest
rank's time. ``device``: on rank 0 alone, what the first sync of 5000 tensors of 400 bytes with
two replicas each on two simulated devices spends compiling its device steps (the manifest's
device parameters, their columns where the checkout has them, and ``DeviceTransport.compile``),
the median of 31, the garbage collector run before and off during each. Rounds alternate the
checkouts (each needs its C extension built in place); the table gives each checkout's median
over rounds and the ratio new/old.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_SETS = ("dict", "lists", "float16", "staged", "device")


def _make(kind: str) -> dict:
    import numpy as np

    if kind == "lists":
        return {
            f"t{i:04d}": [np.full(100, i % 7, np.float32), np.ones(100, np.float32)]
            for i in range(5000)
        }
    if kind == "staged":
        from mpisync.devices.simulated import SimulatedDeviceArray as Dev

        return {
            f"t{i:04d}": [Dev(np.full(100, i % 7, np.float32), 0), Dev(np.ones(100, np.float32), 1)]
            for i in range(2000)
        }
    if kind == "float16":
        return {f"t{i:04d}": np.full(200, i % 7, np.float16) for i in range(5000)}
    return {f"t{i:04d}": np.full(100, i % 7, np.float32) for i in range(5000)}


def _device_compile() -> float:
    """Median seconds of the device steps' compile (see the module doc)."""
    import gc

    import numpy as np

    from mpisync.devices.simulated import SimulatedDeviceArray as Dev
    from mpisync.params.manifest import build_manifest
    from mpisync.transports.device import DeviceTransport

    times = []
    for _ in range(31):
        params = {
            f"t{i:04d}": [
                Dev(np.full(100, 0.0, np.float32), 0),
                Dev(np.full(100, 0.0, np.float32), 1),
            ]
            for i in range(5000)
        }
        manifest = build_manifest(params, rank=1, size=2, root=0)
        transport = DeviceTransport(4, 64 << 10)
        gc.collect()
        gc.disable()
        start = time.perf_counter()
        # the checkouts before the device columns compiled the device parameters themselves
        columns = getattr(manifest, "device_columns", None)
        steps = transport.compile(manifest.device_params if columns is None else columns)
        times.append(time.perf_counter() - start)
        # freed outside the timing: the last references to this round's arrays
        del steps, columns, manifest, params
        gc.enable()
    return statistics.median(times)


def _measure() -> None:
    """Under mpiexec: one line ``set milliseconds`` per set, on rank 0."""
    from mpi4py import MPI

    import mpisync

    comm = MPI.COMM_WORLD
    for kind in _SETS:
        if kind == "device":
            if comm.rank == 0:
                print(kind, _device_compile() * 1e3, flush=True)
            continue
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
