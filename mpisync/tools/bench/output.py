"""Bench results as a text table, JSON, CSV and a PNG plot."""

from __future__ import annotations

import csv as _csv
import json as _json

__all__ = ["table", "write_json", "write_csv", "write_plot", "csv_rows"]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def table(results: dict) -> str:
    """A plain-text report of every section present in ``results``."""
    meta = results["meta"]
    lines = [
        f"mpisync bench: {meta['ranks']} rank{'' if meta['ranks'] == 1 else 's'}, root "
        f"{meta['root']}, {meta['mpi_library']}, "
        f"median of {meta['iterations']} iterations (slowest rank each)"
    ]
    if meta["ranks"] == 1:
        lines.append(
            "1 rank: no peer to broadcast to, so these times are mpisync's own cost on one process "
            "(validation, plans, packing, the local fan-out) and MPI's copy to itself; run under "
            "`mpiexec -n 2` or more to measure broadcasts"
        )
    if results["osu"]:
        lines += _osu_lines(results["osu"])
    for w in results["workloads"]:
        lines += _workload_lines(w)
    if results["sweeps"]:
        lines += _sweep_lines(results["sweeps"])
    if results.get("allreduce"):
        from .allreduce import table as allreduce_table

        lines += ["", allreduce_table(results["allreduce"])]
    return "\n".join(lines)


def _osu_lines(rows: list) -> list:
    lines = [
        "",
        "OSU-style Bcast sweep (latency us: min / avg / max; Ibcast overlap %)",
        f"{'size':>10} {'min':>10} {'avg':>10} {'max':>10} {'GB/s':>7} {'Ibcast':>10} "
        f"{'overlap':>8}",
    ]
    for r in rows:
        lines.append(
            f"{_size(r['bytes']):>10} {r['lat_min_us']:10.2f} {r['lat_avg_us']:10.2f} "
            f"{r['lat_max_us']:10.2f} {r['gbps']:7.2f} {r.get('ibcast_avg_us', 0):10.2f} "
            f"{r.get('overlap_pct', 0):7.1f}%"
        )
    return lines


def _workload_lines(w: dict) -> list:
    lines = [
        "",
        f"{w['workload']}: {w['tensors']} tensors, {w['bytes'] / 1e6:.1f} MB",
        f"  {'strategy':<26} {'ms':>9} {'GB/s':>7} {'vs flat':>8} {'vs per-tensor':>14}  channel",
    ]
    for r in w["results"]:
        lines.append(
            f"  {r['strategy']:<26} {r['median_s'] * 1e3:9.3f} {r['gbps']:7.2f} "
            f"{r['bandwidth_vs_flat']:8.3f} {r['speedup_vs_per_tensor']:13.2f}x  "
            f"{r.get('channel') or ''}".rstrip()
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
        "Sweeps of repeated ParamSync.sync (other settings at their defaults)",
        f"  {'workload':<12} {'setting':<15} {'value':>9} {'ms':>9} {'GB/s':>7} {'vs flat':>8} "
        " channel",
    ]
    for r in rows:
        lines.append(
            f"  {r['workload']:<12} {r['param']:<15} {r['value']:>9} "
            f"{r['median_s'] * 1e3:9.3f} "
            f"{r['gbps']:7.2f} {r['bandwidth_vs_flat']:8.3f}  {r.get('channel') or ''}".rstrip()
        )
    return lines


def write_json(results: dict, path: str) -> None:
    """Everything, as JSON."""
    with open(path, "w") as f:
        _json.dump(results, f, indent=2)


def csv_rows(results: dict) -> list:
    """One flat row per measurement: section, workload, name, value, seconds, GB/s, ratios."""
    rows = []
    for r in results["osu"]:
        rows.append(
            {
                "section": "osu",
                "workload": "",
                "name": "Bcast",
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
            }
        )
    return rows + _allreduce_rows(results.get("allreduce") or {})


def _allreduce_rows(reduced: dict) -> list:
    """The CSV rows of the all-reduce bench (``mpisync bench --allreduce``)."""
    rows = []
    for r in reduced.get("sweep", []):
        for name in ("mpisync", "gloo", "mpi Allreduce"):
            rows.append(
                {
                    "section": "allreduce sweep",
                    "workload": "",
                    "name": name,
                    "value": r["bytes"],
                    "seconds": r[f"{name}_us"] / 1e6,
                    "gbps": r["bytes"] / r[f"{name}_us"] / 1e3,
                    "vs_flat": "",
                    "vs_per_tensor": "",
                }
            )
    for r in reduced.get("grads", []):
        for name in ("GradSync", "GradSync, MPI only", "allreduce, one-shot"):
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
        for name in ("mpisync", "gloo"):
            rows.append(
                {
                    "section": "collectives",
                    "workload": r["collective"],
                    "name": name,
                    "value": r["bytes"],
                    "seconds": r[f"{name}_us"] / 1e6,
                    "gbps": r["bytes"] / r[f"{name}_us"] / 1e3 if r["bytes"] else "",
                    "vs_flat": "",
                    "vs_per_tensor": "",
                }
            )
    for r in reduced.get("check", []):
        for name in ("checked", "unchecked"):
            rows.append(
                {
                    "section": "argument check",
                    "workload": "all_reduce",
                    "name": name,
                    "value": r["bytes"],
                    "seconds": r[f"{name}_us"] / 1e6,
                    "gbps": r["bytes"] / r[f"{name}_us"] / 1e3,
                    "vs_flat": "",
                    "vs_per_tensor": "",
                }
            )
    return rows


def write_csv(results: dict, path: str) -> None:
    """Every measurement as one CSV row."""
    rows = csv_rows(results)
    with open(path, "w", newline="") as f:
        writer = _csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["section"])
        writer.writeheader()
        writer.writerows(rows)


def write_plot(results: dict, path: str) -> None:
    """Bandwidth against message size, and per-strategy bandwidth bars for each workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "mpisync bench --plot needs matplotlib: pip install 'mpisync[plot]'"
        ) from None
    workloads = results["workloads"]
    panels = max(1, (1 if results["osu"] else 0) + len(workloads))
    ncols = min(3, panels)
    nrows = -(-panels // ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.4 * nrows), squeeze=False)
    axes = list(grid.flat)
    for unused in axes[panels:]:
        unused.set_visible(False)
    if results["osu"]:
        ax = axes.pop(0)
        sizes = [r["bytes"] for r in results["osu"]]
        ax.plot(sizes, [r["gbps"] for r in results["osu"]], marker="o", label="Bcast")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(f"Bcast bandwidth, {results['meta']['ranks']} ranks")
        ax.grid(alpha=0.3)
    for ax, w in zip(axes, workloads):
        names = [r["strategy"] for r in w["results"]]
        values = [r["gbps"] for r in w["results"]]
        bars = ax.barh(
            names,
            values,
            color=["tab:green" if n.startswith("ParamSync") else "tab:gray" for n in names],
        )
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=8, padding=2)
        ax.invert_yaxis()
        ax.set_xlabel("GB/s (higher is better)")
        ax.set_title(f"{w['workload']}: {w['tensors']} tensors, {w['bytes'] / 1e6:.0f} MB")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
