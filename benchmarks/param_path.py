"""The path one parameter takes through ``ParamSync.sync``: the mpisync modules it visits, in
order, at 2 ranks (what rank 1, a receiver, runs in its first sync of one numpy array).

    mpiexec -n 2 python benchmarks/param_path.py [--repeat] [--list] [--allreduce]

Prints the number of modules visited, "stays" (maximal stretches of the trace in one module),
"climbs" (a step from a module to one of a higher layer, as tests/test_architecture.py orders
them) and "returns" (a step back into a module left before). ``--repeat``: the second sync of the
same array instead of the first; ``--list``: every stay, in order; ``--allreduce``:
``GradSync.allreduce`` instead of ``ParamSync.sync``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from mpi4py import MPI

import mpisync

# The layers, from the bottom (tests/test_architecture.py).
_LAYERS = [
    ("errors", "report", "config", "_speedups"),
    ("_runtime",),
    ("devices",),
    ("params",),
    ("plan",),
    ("transports",),
    ("allreduce",),
    ("sync", "state", "horovod", "torch", "__init__"),
]


def _layer(module: str) -> int:
    head = module.split(".")[1] if "." in module else module
    for level, names in enumerate(_LAYERS):
        if head in names:
            return level
    return len(_LAYERS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", action="store_true")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--allreduce", action="store_true")
    opt = parser.parse_args()
    comm = MPI.COMM_WORLD
    params = {"weight": np.full(1000, comm.rank, np.float32)}
    stack: list[str] = []
    trace: list[str] = []

    def profile(frame, event, _arg):
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if event == "call":
            stack.append(module)
        elif stack:
            stack.pop()
        current = next((m for m in reversed(stack) if m.startswith("mpisync.")), None)
        if current is not None and (not trace or trace[-1] != current):
            trace.append(current)

    with mpisync.GradSync(comm) if opt.allreduce else mpisync.ParamSync(comm) as syncer:
        run = syncer.allreduce if opt.allreduce else syncer.sync
        if opt.repeat:
            run(params)
        sys.setprofile(profile)
        run(params)
        sys.setprofile(None)
    if comm.rank == 1:
        climbs = sum(1 for a, b in zip(trace, trace[1:]) if _layer(b) > _layer(a))
        seen: set = set()
        returns = 0
        for k, module in enumerate(trace):
            if module in seen:
                returns += 1
            if k:
                seen.add(trace[k - 1])
        print(
            f"{'repeated' if opt.repeat else 'first'} "
            f"{'all-reduce' if opt.allreduce else 'sync'} of one array: "
            f"{len(set(trace))} modules, {len(trace)} stays, {climbs} climbs, {returns} returns"
        )
        if opt.list:
            print(" -> ".join(m.removeprefix("mpisync.") for m in trace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
