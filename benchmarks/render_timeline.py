"""Render mpisync Chrome-trace timelines (one JSON per rank) as a PNG Gantt chart.

    MPISYNC_TIMELINE=/tmp/tl-{rank}.json mpiexec -n 2 python examples/sync_demo.py --steps 2
    python benchmarks/render_timeline.py /tmp/tl-*.json --out docs/timeline.png [--sync N]

``--sync N`` zooms on the N-th sync (counted by its "validate" span, from 1).
"""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"validate": "tab:blue", "pack": "tab:orange", "broadcast": "tab:gray", "unpack": "tab:green",
          "fan-out": "tab:purple", "verify": "tab:red"}
ROWS = ["validate", "broadcast", "pack", "unpack", "fan-out", "verify"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sync", type=int, default=0, help="only the N-th sync (1-based); 0: all")
    args = parser.parse_args()
    ranks = []
    for path in args.paths:
        events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
        ranks.append((events[0]["pid"], events))
    ranks.sort()
    t0 = min(e["ts"] for _, events in ranks for e in events)
    window = None
    if args.sync:
        starts = sorted({e["ts"] for e in ranks[0][1] if e["name"] == "validate"})
        lo = starts[args.sync - 1]
        hi = starts[args.sync] if args.sync < len(starts) else float("inf")
        window = (lo - 1000, hi)
    fig, ax = plt.subplots(figsize=(11, 1.0 + 1.3 * len(ranks)))
    labels, y = [], 0
    for rank, events in ranks:
        for row in ROWS:
            spans = [(e["ts"], e["dur"]) for e in events if e["name"] == row
                     and (window is None or window[0] <= e["ts"] < window[1])]
            if not spans:
                continue
            ax.broken_barh([((s - t0) / 1000, max(d, 1) / 1000) for s, d in spans], (y, 0.8),
                           color=COLORS[row])
            labels.append(f"rank {rank}: {row}")
            y += 1
    ax.set_yticks([i + 0.4 for i in range(y)], labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    if window is not None:
        ax.set_xlim((window[0] - t0) / 1000, None if window[1] == float("inf") else (window[1] - t0) / 1000)
    ax.set_title("mpisync timeline (MPISYNC_TIMELINE): phases per rank")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
