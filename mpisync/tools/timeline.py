"""``mpisync timeline``: draw the Chrome-trace files of ``MPISYNC_TIMELINE`` as one PNG Gantt chart.

    MPISYNC_TIMELINE=/tmp/tl-{rank}.json mpiexec -n 2 python train.py
    mpisync timeline /tmp/tl-*.json --out tl.png [--sync N]

One row per rank and span name: validate, pack, broadcast, unpack, fan-out,
verify, and every transport's own spans (cross-memory, the device
transports); ``allreduce`` (one per all-reduce call), ``stage-checkpoint``,
``torch all_reduce``, ``torch broadcast``, ... (one per operation of the torch
backend), also names this renderer does not know yet. Needs
matplotlib (``pip install 'mpisync[plot]'``); reading the files does not.
"""

from __future__ import annotations

import json as _json
from collections.abc import Sequence

from .._runtime import safefiles
from .outputs import plot_format

__all__ = ["load_trace", "render", "ORDER"]

#: Rows in this order first; any other span name follows, sorted.
ORDER = (
    "validate",
    "pack",
    "broadcast",
    "cross-memory",
    "unpack",
    "fan-out",
    "host",
    "staged",
    "cuda-aware",
    "verify",
    "allreduce",
    "stage-checkpoint",
)
_COLORS = {
    "validate": "tab:blue",
    "pack": "tab:orange",
    "broadcast": "tab:gray",
    "cross-memory": "tab:olive",
    "unpack": "tab:green",
    "fan-out": "tab:purple",
    "host": "tab:brown",
    "staged": "tab:pink",
    "cuda-aware": "gold",
    "verify": "tab:red",
    "allreduce": "tab:blue",
    "stage-checkpoint": "tab:gray",
}


def load_trace(path: str) -> list:
    """The complete ("X") events of one trace file; a file cut short (a job killed while writing,
    or Chrome's array form without its closing bracket) is read up to its last whole event."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        doc = _json.loads(text)
    except ValueError:
        doc = _salvage(text, path)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a Chrome trace (no list of traceEvents)")
    return [
        e
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and isinstance(e.get("ts"), (int, float))
        and isinstance(e.get("dur", 0), (int, float))
    ]


def _salvage(text: str, path: str):
    cut = text.rfind("}")
    while cut > 0:
        head = text[: cut + 1]
        for tail in ("]}", "]"):
            try:
                return _json.loads(head + tail)
            except ValueError:
                pass
        cut = text.rfind("}", 0, cut)
    raise ValueError(f"{path}: not a Chrome trace (no JSON could be read)")


def _window(events: list, sync: int) -> tuple | None:
    if not sync:
        return None
    starts = sorted({e["ts"] for e in events if e["name"] == "validate"})
    if not 1 <= sync <= len(starts):
        raise ValueError(f"--sync {sync}: the first file holds {len(starts)} sync(s)")
    return starts[sync - 1] - 1000, starts[sync] if sync < len(starts) else float("inf")


def render(paths: Sequence[str], out: str, sync: int = 0) -> int:
    """Draw the traces in ``paths`` (one per rank) to the PNG ``out``; return the number of spans
    drawn.

    ``sync`` > 0 zooms on that sync (counted by the first file's "validate" spans, from 1).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = sorted(
        (
            (events[0].get("pid", i), events)
            for i, events in enumerate(load_trace(p) for p in paths)
            if events
        ),
        key=lambda item: item[0],
    )
    if not ranks:
        raise ValueError("no spans in " + ", ".join(paths))
    window = _window(ranks[0][1], sync)
    t0 = min(e["ts"] for _, events in ranks for e in events)
    names = {e["name"] for _, events in ranks for e in events}
    rows = [n for n in ORDER if n in names] + sorted(names - set(ORDER))
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.35 * len(rows) * len(ranks)))
    labels: list[str]
    labels, y, drawn = [], 0, 0
    for rank, events in ranks:
        for row in rows:
            spans = [
                (e["ts"], e.get("dur", 0))
                for e in events
                if e["name"] == row and (window is None or window[0] <= e["ts"] < window[1])
            ]
            if not spans:
                continue
            ax.broken_barh(
                [((s - t0) / 1000, max(d, 1) / 1000) for s, d in spans],
                (y, 0.8),
                color=_COLORS.get(row, f"C{len(labels) % 10}"),
            )
            labels.append(f"rank {rank}: {row}")
            drawn += len(spans)
            y += 1
    ax.set_yticks([i + 0.4 for i in range(y)], labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    if window is not None:
        ax.set_xlim(
            (window[0] - t0) / 1000, None if window[1] == float("inf") else (window[1] - t0) / 1000
        )
    ax.set_title("mpisync timeline (MPISYNC_TIMELINE): spans per rank")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    with safefiles.replacing(out, text=False) as f:  # never through a planted symlink
        fig.savefig(f, dpi=110, format=plot_format(out))
    plt.close(fig)
    return drawn
