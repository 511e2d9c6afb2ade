"""A latency-bandwidth model of parameter broadcast: fitted on the multi-host bench, projected to
clusters.

    python benchmarks/scale_model.py RESULTS.jsonl [...]      (lines written by multihost_bench.py
    --json)

Prints, as markdown: the parameters fitted per layout, the model against every measurement
(error per layout), and the projection to 16, 128 and 1024 nodes. docs/scale.md explains it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

import numpy as np

from mpisync.tools.workloads import workload

#: The cluster of the projection (stated in docs/scale.md).
LINK_BYTES_PER_S = 25e9
LATENCY_S = 2e-6
#: MPICH's classic Bcast selection (MPIR_Bcast_intra_auto): binomial below 12 KiB or under 8
#: processes, scatter + recursive-doubling allgather below 512 KiB (power-of-two counts),
#: scatter + ring allgather above.
SHORT_BYTES, LONG_BYTES, MIN_PROCS = 12288, 524288, 8
FUSION_BYTES, MAX_CONCURRENT = 256 << 10, 16
# : Sets up to this size broadcast at cache speed on the namespace hosts (the last-level cache is 32
# MiB).
CACHED_BYTES = 4 << 20


def plan_sizes(sizes: list, fusion: int = FUSION_BYTES) -> list:
    """Bytes of each collective of mpisync's plan (sorted names; small tensors fused, large
    direct)."""
    out, bucket = [], 0
    for nbytes in sizes:
        if nbytes == 0:
            continue
        if nbytes < fusion:
            if bucket + nbytes > fusion:
                out.append(bucket)
                bucket = 0
            bucket += nbytes
        else:
            if bucket:
                out.append(bucket)
                bucket = 0
            out.append(nbytes)
    return out + ([bucket] if bucket else [])


def tensor_sizes(name: str) -> list:
    """Bytes of each tensor of workload ``name``, in sorted-name order."""
    shapes = workload(name)
    return [
        int(np.prod(shapes[n][0], dtype=np.int64)) * np.dtype(shapes[n][1]).itemsize
        for n in sorted(shapes)
    ]


# ---- the model on the namespace hosts -------------------------------------------------------

SIZES = {"torch-resnet50": tensor_sizes("resnet50"), "many-small": tensor_sizes("many-small")}


def fit_layout(rows: list) -> dict:
    """Per layout and run, from its per-tensor loops and flat Bcasts:

    - ``alpha_small``: seconds per collective of a small tensor, back to back (many-small loop /
    5000);
    - ``beta``: seconds per byte of a set larger than the caches (the 102 MB flat Bcast);
    - ``beta_cached``: seconds per byte of a set that stays in cache (the 2 MB flat Bcast);
    - ``alpha``: seconds per collective of a tensor of MPICH's long sizes (12 KiB and more), back to
      back: what the ResNet-50 loop takes beyond its small collectives and its bytes;
    - ``beta_pipe``: seconds per byte of collectives in flight (mpisync's ResNet-50 steady state).
    """

    def one(workload, strategy):
        return next(
            r["median"] for r in rows if r["workload"] == workload and r["strategy"] == strategy
        )

    alpha_small = one("many-small", "per-tensor loop") / 5000
    sizes = SIZES["torch-resnet50"]
    beta = one("torch-resnet50", "flat Bcast") / sum(sizes)
    beta_cached = one("many-small", "flat Bcast") / sum(SIZES["many-small"])
    small = sum(s < SHORT_BYTES for s in sizes)
    alpha = (one("torch-resnet50", "per-tensor loop") - sum(sizes) * beta - small * alpha_small) / (
        len(sizes) - small
    )
    # Collectives in flight (mpisync) move bytes at their own pace: a blocking Bcast runs its steps
    # (and, with several ranks per host, its stages) one after the other, the ones in flight
    # overlap.
    beta_pipe = one("torch-resnet50", "steady") / sum(sizes)
    return {
        "alpha_small": alpha_small,
        "alpha": max(alpha, 0.0),
        "beta": beta,
        "beta_cached": beta_cached,
        "beta_pipe": beta_pipe,
    }


def predict(strategy: str, sizes: list, k: int, fit: dict, overhead: dict) -> float:
    """Seconds of ``strategy`` for tensors of ``sizes`` bytes, ``k`` collectives in mpisync's plan.

    Collectives in flight (mpisync) move bytes at ``beta_pipe``, a blocking Bcast at ``beta``.
    mpisync's own work per tensor (``overhead``) is counted in small collectives (``alpha_small``):
    on these hosts both are CPU work on the same two shared cores, and slow down together.
    """
    n, nbytes = len(sizes), sum(sizes)
    a_small, a = fit["alpha_small"], fit["alpha"]
    b = fit["beta_cached"] if nbytes <= CACHED_BYTES else fit["beta"]
    if strategy == "flat Bcast":
        return nbytes * b
    if strategy == "per-tensor loop":
        return sum(a_small if s < SHORT_BYTES else a for s in sizes) + nbytes * b
    latency = math.ceil(k / MAX_CONCURRENT) * (a if max(sizes) >= SHORT_BYTES else a_small)
    b_pipe = b * fit["beta_pipe"] / fit["beta"]
    steady = latency + nbytes * b_pipe + n * overhead["steady"] * fit["alpha_small"]
    if strategy == "steady":
        return steady
    # + the validation all-reduce, set-up
    return steady + 2 * a_small + n * overhead["first"] * fit["alpha_small"]


def fit_overheads(groups: dict, fits: dict, plans: dict) -> dict:
    """mpisync's per-tensor work beyond the collectives, in small collectives (``steady``;
    ``first``:
    what a first sync adds): one value each for every layout and run, least squares on relative
    error over the many-small rows (the ResNet-50 ones hardly depend on it)."""
    out = {"steady": 0.0, "first": 0.0}
    for which, strategy in (("steady", "steady"), ("first", "first sync")):
        xs, ys = [], []
        for key, rows in groups.items():
            for r in rows:
                if r["strategy"] == strategy and r["workload"] == "many-small":
                    base = predict(
                        strategy, SIZES[r["workload"]], plans[r["workload"]], fits[key], out
                    )
                    xs.append(r["tensors"] * fits[key]["alpha_small"] / r["median"])
                    ys.append((r["median"] - base) / r["median"])
        out[which] = max(0.0, float(np.dot(xs, ys) / np.dot(xs, xs))) if xs else 0.0
    return out


def check_table(groups: dict, fits: dict, overhead: dict, plans: dict) -> list:
    """Markdown rows: measured vs model for every layout and run; the worst error per layout."""
    lines = [
        "| layout | run | alpha small us | alpha us | GB/s | GB/s cached | GB/s in flight | "
        "workload | strategy "
        "| measured ms | model ms | error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst: dict = {}
    for key in sorted(groups, key=lambda k: (k[1], k[0])):
        fit, (label, layout) = fits[key], key
        for r in sorted(groups[key], key=lambda r: (r["workload"], r["strategy"])):
            if r["strategy"] not in ("steady", "first sync") or (r["workload"], r["strategy"]) == (
                "torch-resnet50",
                "steady",
            ):
                continue
            model = predict(
                r["strategy"], SIZES[r["workload"]], plans[r["workload"]], fit, overhead
            )
            err = model / r["median"] - 1
            worst[layout] = max(worst.get(layout, 0.0), abs(err))
            lines.append(
                f"| {layout} | {label} | {fit['alpha_small'] * 1e6:.1f} | {fit['alpha'] * 1e6:.0f} "
                f"| {1 / fit['beta'] / 1e9:.2f} | {1 / fit['beta_cached'] / 1e9:.2f} | "
                f"{1 / fit['beta_pipe'] / 1e9:.2f} "
                f"| {r['workload']} "
                f"| {r['strategy']} | {r['median'] * 1e3:.2f} | {model * 1e3:.2f} | "
                f"{err * 100:+.0f}% |"
            )
    lines.append("")
    lines.append(
        "Largest error per layout, over every run: "
        + ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(worst.items()))
    )
    return lines


# ---- the projection to a cluster ------------------------------------------------------------


def bcast_terms(
    nbytes: int, nodes: int, alpha: float = LATENCY_S, bw: float = LINK_BYTES_PER_S
) -> tuple:
    """(latency seconds, bandwidth seconds) of one Bcast of ``nbytes`` over ``nodes`` (one rank
    each)."""
    if nodes < 2:
        return 0.0, 0.0
    lg = math.ceil(math.log2(nodes))
    if nbytes < SHORT_BYTES or nodes < MIN_PROCS:
        return lg * alpha, lg * nbytes / bw
    spread = 2 * (nodes - 1) / nodes * nbytes / bw
    if nbytes < LONG_BYTES and nodes & (nodes - 1) == 0:
        return 2 * lg * alpha, spread
    return (lg + nodes - 1) * alpha, spread


def node_scaled(nodes: int) -> tuple:
    """The across-node rule of docs/scale.md: (fusion_bytes, max_concurrent) for ``nodes`` nodes.

    Buckets grow with the node count (64 KiB per node, 256 KiB to 32 MiB) so that a ring's
    per-node latency stays small against its bytes; fewer in flight keep the arena near 256 MiB.
    """
    fusion = min(32 << 20, max(256 << 10, nodes * (64 << 10)))
    return fusion, max(4, min(16, (256 << 20) // fusion))


def mpisync_time(sizes: list, nodes: int, overhead: dict, fusion: int, concurrent: int) -> tuple:
    """Projected (steady, first) seconds of mpisync with ``fusion`` and ``concurrent``."""
    terms = [bcast_terms(s, nodes) for s in plan_sizes(sizes, fusion)]
    # Up to ``concurrent`` collectives in flight: their latencies overlap, their bytes share the
    # links.
    # one small all-reduce before the data, every sync
    agreement = 2 * math.ceil(math.log2(nodes)) * LATENCY_S
    steady = (
        agreement
        + sum(t[0] for t in terms) / concurrent
        + max(t[0] for t in terms)
        + sum(t[1] for t in terms)
        + len(sizes) * overhead["steady"]
    )
    return steady, steady + agreement + len(sizes) * overhead["first"], len(terms)


def project(name: str, nodes: int, overhead: dict) -> dict:
    """``overhead``: mpisync's seconds per tensor (steady, first's extra). Projected seconds for
    workload ``name`` on ``nodes`` nodes: loop, flat, mpisync (defaults and node-scaled rule)."""
    sizes = tensor_sizes(name)
    steady, first, k = mpisync_time(sizes, nodes, overhead, FUSION_BYTES, MAX_CONCURRENT)
    scaled = mpisync_time(sizes, nodes, overhead, *node_scaled(nodes))
    return {
        "tensors": len(sizes),
        "bytes": sum(sizes),
        "collectives": k,
        "loop": sum(sum(bcast_terms(s, nodes)) for s in sizes),
        "flat": sum(bcast_terms(sum(sizes), nodes)),
        "steady": steady,
        "first": first,
        "scaled_steady": scaled[0],
        "scaled_first": scaled[1],
        "scaled_collectives": scaled[2],
    }


def projection_table(overhead: dict) -> list:
    """Markdown rows of the projection."""
    lines = [
        "| workload | nodes | per-tensor loop ms | flat Bcast ms | mpisync steady ms | mpisync "
        "first ms "
        "| loop / steady | node-scaled rule: steady ms (first ms, collectives) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("resnet50", "bert-base", "gpt2-small"):
        for nodes in (16, 128, 1024):
            p = project(name, nodes, overhead)
            f, c = node_scaled(nodes)
            lines.append(
                f"| {name} ({p['tensors']} tensors, {p['bytes'] / 1e6:.0f} MB, {p['collectives']} "
                "collectives) "
                f"| {nodes} | {p['loop'] * 1e3:.2f} | {p['flat'] * 1e3:.2f} | "
                f"{p['steady'] * 1e3:.2f} "
                f"| {p['first'] * 1e3:.2f} | {p['loop'] / p['steady']:.2f}x "
                f"| {p['scaled_steady'] * 1e3:.2f} ({p['scaled_first'] * 1e3:.2f}, "
                f"{p['scaled_collectives']}; "
                f"{f >> 10} KiB/{c}) |"
            )
    return lines


def main(argv=None) -> int:
    """Fit, check and project; print markdown."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+")
    p.add_argument("--label", help="use only results with this label")
    p.add_argument(
        "--per-run",
        action="store_true",
        help="fit and check every run on its own (default: "
        "each layout's rows are the medians over the runs)",
    )
    args = p.parse_args(argv)
    rows = [json.loads(line) for path in args.results for line in open(path) if line.strip()]
    rows = [r for r in rows if args.label is None or r.get("label") == args.label]
    # default settings only
    rows = [r for r in rows if "," not in r["strategy"] and "K/" not in r["strategy"]]
    groups: dict = {}
    for r in rows:
        label = (
            r.get("label", "")
            if args.per_run
            else f"median of {len({x.get('label') for x in rows})} runs"
        )
        groups.setdefault((label, f"{r['hosts']}x{r['ranks'] // r['hosts']}"), []).append(r)
    # several runs in one group: each row the median of the runs' medians
    for key, rs in groups.items():
        merged: dict = {}
        for r in rs:
            merged.setdefault((r["workload"], r["strategy"]), []).append(r)
        groups[key] = [
            dict(v[0], median=statistics.median(x["median"] for x in v)) for v in merged.values()
        ]
    fits = {key: fit_layout(rs) for key, rs in groups.items()}
    plans = {name: len(plan_sizes(sizes)) for name, sizes in SIZES.items()}
    overhead = fit_overheads(groups, fits, plans)
    # In seconds for the projection: at 2x1, the one layout where no rank waits for a core.
    small_2x1 = statistics.median(
        f["alpha_small"] for (_, layout), f in fits.items() if layout == "2x1"
    )
    per_tensor = {k: overhead[k] * small_2x1 for k in ("steady", "first")}
    print(
        f"Per-tensor work of mpisync (fitted over every layout and run), in small collectives: "
        f"steady {overhead['steady']:.3f}, first sync {overhead['first']:.3f} more; at 2x1 "
        f"({small_2x1 * 1e6:.1f} us each): {per_tensor['steady'] * 1e6:.2f} us and "
        f"{per_tensor['first'] * 1e6:.2f} us"
    )
    print()
    print("\n".join(check_table(groups, fits, overhead, plans)))
    print()
    print("\n".join(projection_table(per_tensor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
