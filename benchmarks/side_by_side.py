"""Two checkouts of mpisync, benchmarked side by side: ``mpisync bench`` alternating between them.

    python benchmarks/side_by_side.py OLD_CHECKOUT NEW_CHECKOUT --rounds 3 -- --quick --allreduce
    python benchmarks/side_by_side.py . . --new-env MPISYNC_SPEEDUPS_WITHOUT=array_list -- --quick

Each round runs ``mpiexec -n RANKS python -m mpisync bench --json F ARGS`` once with the old
checkout first on ``PYTHONPATH``, then once with the new one (the next round starts with the
new one, so neither always runs first on a machine whose load comes and goes). Each checkout
needs its C extension built in place (``python setup.py build_ext --inplace``). The table
gives, per bench row, the median over rounds of each checkout's time and the ratio new/old
(above 1: the new checkout is slower); rows are the bench's timed results: OSU latencies,
each workload's strategies, the sweeps and the all-reduce rows. ``--old-env``/``--new-env``
``NAME=VALUE`` set environment variables for one side only: one checkout with and without a C
loop, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_TIME_KEYS = ("median_s", "lat_avg_us")


def _rows(doc: dict) -> dict:
    """``{row name: seconds}`` for every timed row of one bench JSON document."""
    rows = {}
    osu = doc.get("osu") or {}
    # {operation: rows}; a checkout from before the raw rows of four operations: Bcast's list
    for op, entries in (osu if isinstance(osu, dict) else {"bcast": osu}).items():
        for r in entries:
            rows[f"osu {op} {r['bytes']} B"] = r["lat_avg_us"] * 1e-6
    for w in doc.get("workloads") or ():
        for r in w["results"]:
            rows[f"{w['workload']}: {r['strategy']}"] = r["median_s"]
    for r in doc.get("sweeps") or ():
        rows[f"sweep {r['workload']} {r['param']}={r['value']}"] = r["median_s"]
    for section, entries in (doc.get("allreduce") or {}).items():
        for r in entries if isinstance(entries, list) else ():
            label = " ".join(
                f"{k}={r[k]}"
                for k in ("collective", "workload", "set", "bytes", "model", "size", "op")
                if k in r
            )
            for key, value in r.items():
                if key.endswith("_us") and isinstance(value, (int, float)):
                    rows[f"allreduce {section} {label} {key[:-3]}"] = value * 1e-6
                elif key.endswith("_ms") and isinstance(value, (int, float)):
                    rows[f"allreduce {section} {label} {key[:-3]}"] = value * 1e-3
    return rows


def _run(checkout: str, ranks: int, bench_args: list, out: Path, extra_env: list) -> dict:
    env = dict(os.environ, PYTHONPATH=checkout, HYDRA_LAUNCHER="fork")
    env.update(item.split("=", 1) for item in extra_env)
    env.setdefault("MPIEXEC_TIMEOUT", "1800")
    cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "mpisync", "bench", "--no-progress"]
    subprocess.run(
        ["timeout", "1900", *cmd, "--json", str(out), *bench_args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=checkout,
    )
    return _rows(json.loads(out.read_text()))


def main(argv=None) -> int:
    """Run the rounds and print the side-by-side table; the exit status is 0."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog="Arguments after -- go to mpisync bench."
    )
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    for side in ("old", "new"):
        parser.add_argument(
            f"--{side}-env", action="append", default=[], metavar="NAME=VALUE", help=f"{side} only"
        )
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    opt = parser.parse_args(argv[:split])
    opt.bench_args = argv[split + 1 :]  # after --: the arguments of mpisync bench
    times: dict = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(opt.rounds):
            order = ("old", "new") if k % 2 == 0 else ("new", "old")
            for which in order:
                checkout = str(Path(getattr(opt, which)).resolve())
                out, extra = Path(tmp) / f"{which}{k}.json", getattr(opt, f"{which}_env")
                rows = _run(checkout, opt.ranks, opt.bench_args, out, extra)
                for name, seconds in rows.items():
                    times[which].setdefault(name, []).append(seconds)
            print(f"round {k + 1}/{opt.rounds} done", file=sys.stderr, flush=True)
    names = [n for n in times["old"] if n in times["new"]]
    width = max(len(n) for n in names)
    print(f"{'row':<{width}} {'old ms':>10} {'new ms':>10} {'new/old':>8}")
    for name in names:
        old, new = (statistics.median(times[w][name]) for w in ("old", "new"))
        print(f"{name:<{width}} {old * 1e3:10.4f} {new * 1e3:10.4f} {new / old:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
