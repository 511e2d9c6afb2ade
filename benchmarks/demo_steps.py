"""The main job's steps, launched as a user launches it, for several checkouts or settings in turn.

    python benchmarks/demo_steps.py --rounds 5 --side old=/path/to/old --side new=. \
        --side "mpi-only=.:MPISYNC_CROSS_MEMORY=0"

Each ``--side NAME=CHECKOUT[:VAR=VALUE,...]`` is one way to run ``examples/sync_demo.py`` (a fresh
``mpiexec -n 2`` each launch, the checkout first on ``PYTHONPATH``, with those variables set).
Each round launches every side once, the order rotated each round, so no side always runs first
on a machine whose load comes and goes. Prints each launch's step times (rank 0's report) and,
per side, each step's min / median / max over the rounds, and step 1 / step 2.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

_STEP = re.compile(r"^step (\d+): .* in ([0-9.]+) ms", re.MULTILINE)


def _side(text: str) -> tuple:
    name, _, rest = text.partition("=")
    checkout, _, env = rest.partition(":")
    variables = dict(item.split("=", 1) for item in env.split(",") if item)
    return name, os.path.abspath(checkout), variables


def _launch(checkout: str, variables: dict, steps: int) -> list:
    env = {**os.environ, **variables, "PYTHONPATH": checkout, "MPIEXEC_TIMEOUT": "300"}
    demo = os.path.join(checkout, "examples", "sync_demo.py")
    command = ["mpiexec", "-n", "2", sys.executable, demo, "--steps", str(steps)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=360, check=True)
    if "identical on every rank: True" not in out.stdout:
        raise SystemExit(f"the demo did not sync:\n{out.stdout}\n{out.stderr}")
    return [float(ms) for _, ms in _STEP.findall(out.stdout)]


def main() -> None:
    """Launch, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--side", action="append", required=True, type=_side)
    args = parser.parse_args()
    times: dict = {name: [] for name, _, _ in args.side}
    for round_ in range(args.rounds):
        k = round_ % len(args.side)
        for name, checkout, variables in args.side[k:] + args.side[:k]:
            steps = _launch(checkout, variables, args.steps)
            times[name].append(steps)
            shown = ", ".join(f"{ms:.2f}" for ms in steps)
            print(f"round {round_ + 1} {name}: steps {shown} ms", flush=True)
    print("\nside: per step, min / median / max ms over the rounds; step 1 / step 2 per launch")
    for name, launches in times.items():
        columns = list(zip(*launches))
        parts = [
            f"step {i}: {min(c):.2f} / {statistics.median(c):.2f} / {max(c):.2f}"
            for i, c in enumerate(columns)
        ]
        ratio = ", ".join(f"{s[1] / s[2]:.2f}" for s in launches) if args.steps > 2 else "-"
        first_two = ", ".join(f"{s[0] + s[1]:.2f}" for s in launches)
        print(f"{name}: {'; '.join(parts)}; step 1 / step 2: {ratio}; steps 0 + 1: {first_two}")


if __name__ == "__main__":
    main()
