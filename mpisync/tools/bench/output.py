"""Bench results as a text table, JSON, CSV and a PNG plot."""

from __future__ import annotations

import csv as _csv
import json as _json

from ..._runtime import safefiles
from ..outputs import plot_format
from .text import DOCS, ratio_text

__all__ = ["table", "write_json", "write_csv", "write_plot", "csv_rows", "NOISY", "osu_outliers"]

#: A row whose slowest sample is more than this many times its fastest is flagged as noisy.
NOISY = 2.0
#: A raw MPI row whose mean latency is more than this many times both its neighbours' is flagged:
#: latency grows with size, so a spike between two sizes is noise, not the network.
_OSU_SPIKE = 3.0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


_OSU_NAMES = {
    "bcast": "MPI_Bcast (osu_bcast)",
    "allreduce": "MPI_Allreduce, float32 sum (osu_allreduce)",
    "reduce": "MPI_Reduce to the root, float32 sum (osu_reduce)",
    "allgather": "MPI_Allgather, size from each rank (osu_allgather)",
}


def table(results: dict) -> str:
    """A plain-text report of every section present in ``results``."""
    meta = results["meta"]
    ranks = meta["ranks"]
    lines = [
        f"mpisync bench: {ranks} rank{'' if ranks == 1 else 's'}, root {meta['root']}, "
        f"{meta['mpi_library']}, {meta.get('node_ranks', ranks)} of the ranks on rank 0's node",
        *_environment_lines(meta),
        "Raw MPI rows: OSU's method (means per call; OSU's own programs run at MPI thread level "
        "single: MPI4PY_RC_THREAD_LEVEL=single to compare). Every other table: the median over "
        f"{meta['iterations']} iterations (after {meta['warmup']} untimed) of the slowest rank's "
        f"time. Each table's columns are explained under it; how each figure is made: {DOCS}.",
    ]
    if ranks == 1:
        lines.append(
            "1 rank: no peer to broadcast to, so these times are mpisync's own cost on one process "
            "(validation, plans, packing, the local fan-out) and MPI's copy to itself; run under "
            "`mpiexec -n 2` or more to measure broadcasts"
        )
    if meta.get("quick"):
        lines.append(
            "--quick: a SMOKE TEST (few iterations, raw MPI rows at a fraction of OSU's counts): "
            "it shows the bench runs; do not compare clusters or versions with its figures"
        )
    for op, rows in (results["osu"] or {}).items():
        lines += _osu_lines(op, rows, meta)
    for w in results["workloads"]:
        lines += _workload_lines(w)
    if results["sweeps"]:
        lines += _sweep_lines(results["sweeps"])
    if results.get("allreduce"):
        from .allreduce import table as allreduce_table

        lines += ["", allreduce_table(results["allreduce"])]
    return "\n".join(lines)


def _osu_lines(op: str, rows: list, meta: dict) -> list:
    bcast = bool(rows) and "ibcast_avg_us" in rows[0]  # the Ibcast columns (not --no-ibcast)
    lines = [
        "",
        f"{_OSU_NAMES[op]}: OSU's method, timed loop: {meta.get('osu_method', 'C loop')}, "
        f"MPI thread level {meta.get('thread_level', '?')}",
        f"{'size':>10} {'iters':>6} {'min us':>10} {'avg us':>10} {'max us':>10} {'GB/s':>7}"
        + (f" {'Ibcast us':>10} {'overlap':>8}" if bcast else ""),
    ]
    spikes = osu_outliers(rows)
    for i, r in enumerate(rows):
        line = (
            f"{_size(r['bytes']):>10} {r['iterations']:>6} {r['lat_min_us']:10.2f} "
            f"{r['lat_avg_us']:10.2f} {r['lat_max_us']:10.2f} {r['gbps']:7.3f}"
        )
        if bcast:
            line += f" {r['ibcast_avg_us']:10.2f} {r['overlap_pct']:7.1f}%"
        lines.append(line + ("  ! outlier" if i in spikes else ""))
    lines.append(
        "  size: bytes per call (all-gather: from each rank); iters: timed calls per rank (after "
        "untimed warm-up ones), each followed by a barrier; min/avg/max us: the lowest, mean and "
        "highest across ranks of each rank's mean time per call, microseconds; GB/s: size / avg"
        + (
            "; Ibcast us: mean of Ibcast+Wait (timed from Python, across ranks); overlap: "
            "osu_ibcast's share of a computation as long as Ibcast that Ibcast hides, %"
            if bcast
            else ""
        )
        + f"; ! outlier: a mean over {_OSU_SPIKE:g}x both neighbours' (noise: run again) "
        + "(docs/performance.md, Raw MPI rows)"
    )
    return lines


def osu_outliers(rows: list) -> set:
    """The indexes of raw MPI rows whose mean latency is over ``_OSU_SPIKE`` times both
    neighbours' (the first and last rows: their one neighbour's)."""
    out = set()
    for i, r in enumerate(rows):
        near = [rows[j]["lat_avg_us"] for j in (i - 1, i + 1) if 0 <= j < len(rows)]
        if near and all(r["lat_avg_us"] > _OSU_SPIKE * max(n, 1e-3) for n in near):
            out.add(i)
    return out


def _environment_lines(meta: dict) -> list:
    env = meta.get("environment")
    if not env:
        return []
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    per_node = sorted(set(env["ranks_per_node"].values()))
    return [
        f"{env['nodes']} node(s), {'/'.join(map(str, per_node))} rank(s) per node; CPU "
        f"{env['cpu']} ({env['machine']}); MPI {env['mpi_version']}, transport "
        f"{env['mpi_transport']}; {versions}"
    ]


def _spread(r: dict) -> str:
    """A row's fastest-slowest samples in ms, flagged when the slowest is over ``NOISY`` x."""
    if "min_s" not in r:
        return ""
    text = f"{r['min_s'] * 1e3:.3f}-{r['max_s'] * 1e3:.3f}"
    return text + (" !" if r["max_s"] > NOISY * r["min_s"] else "")


_WORKLOAD_LEGEND = (
    "  ms: median over iterations of the slowest rank's time for one whole sync, milliseconds; "
    f"min-max ms: the fastest and slowest iteration (! the slowest over {NOISY:g}x the fastest: "
    "a noisy row, run again before comparing it); "
    "GB/s: the set's bytes / ms; x flat: flat Bcast's time / this row's (above 1x: faster than "
    "one Bcast of one buffer of the same bytes); x per-tensor: the per-tensor Bcast loop's time / "
    "this row's; of limit: the limit row's time / this row's (1.00x: at the memory limit of "
    "the node); channel: the transport mpisync chose. "
)


def _workload_lines(w: dict) -> list:
    width = max([26, *(len(r["strategy"]) for r in w["results"])])
    lines = [
        "",
        f"{w['workload']}: {w['tensors']} tensors, {w['bytes'] / 1e6:.1f} MB, broadcast",
        f"  {'strategy':<{width}} {'ms':>9} {'min-max ms':>17} {'GB/s':>7} {'x flat':>7} "
        f"{'x per-tensor':>13} {'of limit':>9}  channel",
    ]
    for r in w["results"]:
        lines.append(
            f"  {r['strategy']:<{width}} {r['median_s'] * 1e3:9.3f} {_spread(r):>17} "
            f"{r['gbps']:7.2f} "
            f"{ratio_text(r['bandwidth_vs_flat']):>7} {ratio_text(r['speedup_vs_per_tensor']):>13} "
            f"{ratio_text(r.get('of_limit')):>9}  {r.get('channel') or ''}".rstrip()
        )
    per_rank = w.get("limit_bytes_per_rank", 0)
    lines.append(
        _WORKLOAD_LEGEND
        + f"The limit row: every rank copies {per_rank / 1e6:.1f} MB with numpy, all at once "
        f"(the receivers' bytes shared by the ranks' cores; {DOCS}, The limit row)."
    )
    m = w["memory"]
    if m is not None:  # None: not measured (torch sets)
        lines.append(
            "  memory held by mpisync during a sync (traced peak + its buffers, max over ranks): "
            "repeated "
            f"{m['extra_bytes_repeated'] / 1e6:.2f} MB, cold {m['extra_bytes_cold'] / 1e6:.2f} MB "
            f"(bound max_concurrent x fusion_bytes = {m['bound_bytes'] / 1e6:.2f} MB); "
            f"peak RSS {m['peak_rss_bytes'] / 1e6:.0f} MB"
        )
    return lines


def _sweep_lines(rows: list) -> list:
    lines = [
        "",
        "Sweeps of repeated ParamSync.sync, one setting changed (the others at their defaults)",
        f"  {'workload':<12} {'setting':<15} {'value':>9} {'ms':>9} {'min-max ms':>17} "
        f"{'GB/s':>7} {'x flat':>7} {'of limit':>9}  channel",
    ]
    for r in rows:
        lines.append(
            f"  {r['workload']:<12} {r['param']:<15} {r['value']:>9} "
            f"{r['median_s'] * 1e3:9.3f} {_spread(r):>17} {r['gbps']:7.2f} "
            f"{ratio_text(r['bandwidth_vs_flat']):>7} "
            f"{ratio_text(r.get('of_limit')):>9}  {r.get('channel') or ''}".rstrip()
        )
    lines.append(
        "  ms: median over iterations of the slowest rank's time for one whole sync, "
        "milliseconds; min-max ms, GB/s, x flat, of limit: as in the workload's table above, "
        "timed side by "
        f"side with its rows ({DOCS})"
    )
    return lines


def write_json(results: dict, path: str) -> None:
    """Everything, as JSON (written as every mpisync file is: :mod:`mpisync._runtime.safefiles`)."""
    with safefiles.replacing(path) as f:
        _json.dump(results, f, indent=2)


CSV_FIELDS = [
    "section",
    "workload",
    "name",
    "value",
    "seconds",
    "gbps",
    "vs_flat",
    "vs_per_tensor",
    "of_limit",
]


def csv_rows(results: dict) -> list:
    """One flat row per measurement: section, workload, name, value, seconds, GB/s, ratios."""
    rows = []
    for op, osu_rows in (results["osu"] or {}).items():
        for r in osu_rows:
            rows.append(
                {
                    "section": "osu",
                    "workload": "",
                    "name": op,
                    "value": r["bytes"],
                    "seconds": r["lat_avg_us"] / 1e6,
                    "gbps": r["gbps"],
                    "vs_flat": "",
                    "vs_per_tensor": "",
                }
            )
    for w in results["workloads"]:
        for r in w["results"]:
            rows.append(
                {
                    "section": "workload",
                    "workload": w["workload"],
                    "name": r["strategy"],
                    "value": w["bytes"],
                    "seconds": r["median_s"],
                    "gbps": r["gbps"],
                    "vs_flat": r["bandwidth_vs_flat"],
                    "vs_per_tensor": r["speedup_vs_per_tensor"],
                    "of_limit": r.get("of_limit") or "",
                }
            )
    for r in results["sweeps"]:
        rows.append(
            {
                "section": "sweep",
                "workload": r["workload"],
                "name": r["param"],
                "value": r["value"],
                "seconds": r["median_s"],
                "gbps": r["gbps"],
                "vs_flat": r["bandwidth_vs_flat"],
                "vs_per_tensor": "",
                "of_limit": r.get("of_limit") or "",
            }
        )
    return rows + _allreduce_rows(results.get("allreduce") or {})


def _allreduce_rows(reduced: dict) -> list:
    """The CSV rows of the all-reduce bench (``mpisync bench --allreduce``)."""
    rows = []
    for r in reduced.get("sweep", []):
        rows += _timed_rows("allreduce sweep", "", r, ("mpisync", "gloo", "mpi Allreduce"))
    for r in reduced.get("grads", []):
        for name in ("GradSync", "allreduce, one-shot"):
            seconds = r[f"{name}_ms"] / 1e3
            rows.append(
                {
                    "section": "allreduce grads",
                    "workload": r["workload"],
                    "name": name,
                    "value": r["bytes"],
                    "seconds": seconds,
                    "gbps": r["bytes"] / seconds / 1e9,
                    "vs_flat": r["flat Allreduce_ms"] / r[f"{name}_ms"],
                    "vs_per_tensor": (
                        r["per-tensor Allreduce_ms"] / r[f"{name}_ms"]
                        if "per-tensor Allreduce_ms" in r
                        else ""
                    ),
                }
            )
    rows += _collective_rows(reduced)
    if "ddp" in reduced:
        for name in ("mpisync", "gloo", "no communication", "DDP, no-op hook"):
            rows.append(
                {
                    "section": "allreduce ddp",
                    "workload": "mlp",
                    "name": name,
                    "value": "",
                    "seconds": reduced["ddp"][f"{name}_ms"] / 1e3,
                    "gbps": "",
                    "vs_flat": "",
                    "vs_per_tensor": "",
                }
            )
    return rows


def _collective_rows(reduced: dict) -> list:
    """The CSV rows of the torch backend's collectives beside gloo, and of the check's cost."""
    rows = []
    for r in reduced.get("collectives", []):
        rows += _timed_rows("collectives", r["collective"], r, ("mpisync", "gloo"))
    for r in reduced.get("check", []):
        rows += _timed_rows("argument check", "all_reduce", r, ("checked", "unchecked"))
    return rows


def _timed_rows(section: str, workload: str, row: dict, names: tuple) -> list:
    """The CSV rows of ``names``' times in microseconds (``<name>_us``) over ``row["bytes"]``."""
    return [
        {
            "section": section,
            "workload": workload,
            "name": name,
            "value": row["bytes"],
            "seconds": row[f"{name}_us"] / 1e6,
            "gbps": row["bytes"] / row[f"{name}_us"] / 1e3 if row["bytes"] else "",
            "vs_flat": "",
            "vs_per_tensor": "",
        }
        for name in names
    ]


def write_csv(results: dict, path: str) -> None:
    """Every measurement as one CSV row."""
    rows = csv_rows(results)
    with safefiles.replacing(path, newline="") as f:
        writer = _csv.DictWriter(f, fieldnames=CSV_FIELDS, restval="")
        writer.writeheader()
        writer.writerows(rows)


def write_plot(results: dict, path: str) -> None:
    """Bandwidth against message size, and per-strategy bandwidth bars for each workload."""
    try:
        import matplotlib
        import matplotlib.patches

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "mpisync bench --plot needs matplotlib: pip install 'mpisync[plot]'"
        ) from None
    workloads, osu = results["workloads"], results["osu"] or {}
    panels = max(1, (1 if osu else 0) + len(workloads))
    ncols = min(3, panels)
    nrows = -(-panels // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.4 * nrows), squeeze=False)
    axes = list(grid.flat)
    for unused in axes[panels:]:
        unused.set_visible(False)
    if osu:
        ax = axes.pop(0)
        for op, rows in osu.items():
            sizes = [r["bytes"] for r in rows]
            gbps = [r["gbps"] for r in rows]
            # the slowest and fastest rank's mean, as GB/s
            low = [g - r["bytes"] / r["lat_max_us"] / 1e3 for g, r in zip(gbps, rows)]
            high = [r["bytes"] / r["lat_min_us"] / 1e3 - g for g, r in zip(gbps, rows)]
            ax.errorbar(
                sizes,
                gbps,
                yerr=[low, high],
                marker="o",
                markersize=3,
                capsize=2,
                label=_OSU_NAMES[op].split(" (")[0],
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("GB/s (size / mean latency; bars: fastest-slowest rank)")
        ax.set_title(f"raw MPI rows, OSU's method, {results['meta']['ranks']} ranks")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    colours = {"mpisync": "tab:green", "reference": "tab:gray", "limit": "tab:blue"}
    for ax, w in zip(axes, workloads):
        rows = w["results"]
        names = [r["strategy"] for r in rows]
        values = [r["gbps"] for r in w["results"]]
        kinds = [_kind(n) for n in names]
        errors = [
            [v - w["bytes"] / r.get("max_s", r["median_s"]) / 1e9 for v, r in zip(values, rows)],
            [w["bytes"] / r.get("min_s", r["median_s"]) / 1e9 - v for v, r in zip(values, rows)],
        ]
        bars = ax.barh(names, values, xerr=errors, capsize=2, color=[colours[k] for k in kinds])
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8, padding=2)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("GB/s, the set's bytes / median time, log scale; bars: slowest-fastest")
        ax.set_title(f"{w['workload']}: {w['tensors']} tensors, {w['bytes'] / 1e6:.0f} MB")
        handles = [
            matplotlib.patches.Patch(color=colours[k], label=label)
            for k, label in (
                ("mpisync", "mpisync"),
                ("reference", "MPI references"),
                ("limit", "limit: local copies"),
            )
            if k in kinds
        ]
        ax.legend(handles=handles, fontsize=8, loc="best")
    fig.tight_layout()
    with safefiles.replacing(path, text=False) as f:
        fig.savefig(f, dpi=110, format=plot_format(path))
    plt.close(fig)


def _kind(strategy: str) -> str:
    if strategy.startswith("limit"):
        return "limit"
    if strategy.startswith(("ParamSync", "sync_params")):
        return "mpisync"
    return "reference"
