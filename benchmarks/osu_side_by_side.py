"""The bench's raw MPI rows beside OSU Micro-Benchmarks' own programs, run alternately.

    OSU=/path/to/osu-micro-benchmarks/mpi/collective python benchmarks/osu_side_by_side.py \
        --rounds 3 --max-bytes 1048576

``OSU`` is a folder holding osu_bcast, osu_allreduce, osu_reduce and osu_allgather built against
the same MPI library as mpi4py (for the MPICH wheel: ``gcc -I<venv>/include osu_bcast.c
osu_coll.c -L<venv>/lib -Wl,-rpath,<venv>/lib -lmpi``). Each round runs, for each operation,
OSU's program, then ``mpisync bench --osu-ops OP`` with mpi4py's default thread level
(``MPI_THREAD_MULTIPLE``), then the same with ``MPI4PY_RC_THREAD_LEVEL=single`` (as OSU's
``MPI_Init``). Prints, per operation and size, the median over rounds of each one's mean latency
(avg across ranks, us) and the bench's / OSU's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

OPERATIONS = ("bcast", "allreduce", "reduce", "allgather")


def _launch(ranks: int, cmd: list, env: dict) -> str:
    full = ["mpiexec", "-n", str(ranks), *cmd]
    env = dict(env, MPIEXEC_TIMEOUT=env.get("MPIEXEC_TIMEOUT", "600"))
    proc = subprocess.run(full, env=env, capture_output=True, text=True, timeout=630)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(full)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def osu(folder: str, op: str, ranks: int, max_bytes: int) -> dict:
    """OSU's program: size -> avg latency, us."""
    out = _launch(ranks, [os.path.join(folder, f"osu_{op}"), "-m", f"1:{max_bytes}"], os.environ)
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    return {int(r[0]): float(r[1]) for r in rows}


def ours(op: str, ranks: int, max_bytes: int, thread_level: str | None) -> dict:
    """``mpisync bench``'s raw rows of ``op``: size -> avg latency, us."""
    env = dict(os.environ)
    if thread_level:
        env["MPI4PY_RC_THREAD_LEVEL"] = thread_level
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "osu.json")
        cmd = [sys.executable, "-m", "mpisync", "bench", "--no-progress", "--no-sweep"]
        cmd += ["--workloads=", "--osu-ops", op, "--osu-max", str(max_bytes), "--no-ibcast"]
        cmd += ["--json", path]
        _launch(ranks, cmd, env)
        with open(path) as f:
            results = json.load(f)
    return {r["bytes"]: r["lat_avg_us"] for r in results["osu"][op]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--max-bytes", type=int, default=1 << 20)
    p.add_argument("--ops", default=",".join(OPERATIONS))
    args = p.parse_args()
    folder = os.environ.get("OSU")
    if not folder:
        sys.exit("set OSU to the folder holding osu_bcast, osu_allreduce, ...")
    for op in args.ops.split(","):
        runs: dict = {"OSU": [], "bench": [], "bench, single": []}
        for _ in range(args.rounds):
            runs["OSU"].append(osu(folder, op, args.ranks, args.max_bytes))
            runs["bench"].append(ours(op, args.ranks, args.max_bytes, None))
            runs["bench, single"].append(ours(op, args.ranks, args.max_bytes, "single"))
        print(f"\n{op}, {args.ranks} ranks: median over {args.rounds} rounds of avg latency, us")
        print(
            f"{'size':>9} {'OSU':>10} {'bench':>10} {'single':>10} {'bench/OSU':>10} "
            f"{'single/OSU':>11}"
        )
        for size in sorted(runs["bench"][0]):
            med = {k: statistics.median(r[size] for r in v) for k, v in runs.items()}
            print(
                f"{size:>9} {med['OSU']:10.2f} {med['bench']:10.2f} {med['bench, single']:10.2f} "
                f"{med['bench'] / med['OSU']:9.2f}x {med['bench, single'] / med['OSU']:10.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
