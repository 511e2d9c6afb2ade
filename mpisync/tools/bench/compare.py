"""``mpisync bench --compare A.json B.json``: two bench runs row by row (two clusters, or two
versions on one), each row's ratio B/A of medians with both runs' spread.

A row's spread is its fastest and slowest iteration (the raw MPI rows: the fastest and slowest
rank's mean). A ratio is called a difference only where the two runs' ranges do not overlap;
otherwise it is "within spread". No MPI is needed: it reads the two files.
"""

from __future__ import annotations

import json as _json
import typing as _typing

__all__ = ["Row", "rows_of", "compare", "main"]


class Row(_typing.NamedTuple):
    """One timed row: its median and its fastest and slowest, in seconds (``low``/``high`` None
    where the file has no spread for it)."""

    median: float
    low: float | None
    high: float | None


def rows_of(doc: dict) -> dict:
    """``{row name: Row}`` for every timed row of one bench JSON document."""
    rows: dict = {}
    for op, entries in (doc.get("osu") or {}).items():
        for r in entries:
            rows[f"osu {op} {r['bytes']} B"] = Row(
                r["lat_avg_us"] * 1e-6, r["lat_min_us"] * 1e-6, r["lat_max_us"] * 1e-6
            )
    for w in doc.get("workloads") or ():
        for r in w["results"]:
            rows[f"{w['workload']}: {r['strategy']}"] = _timed(r)
    for r in doc.get("sweeps") or ():
        rows[f"sweep {r['workload']} {r['param']}={r['value']}"] = _timed(r)
    for section, entries in (doc.get("allreduce") or {}).items():
        for r in entries if isinstance(entries, list) else [entries]:
            rows.update(_allreduce_rows(section, r))
    return rows


def _timed(r: dict) -> Row:
    return Row(r["median_s"], r.get("min_s"), r.get("max_s"))


def _allreduce_rows(section: str, r: dict) -> dict:
    label = " ".join(
        f"{k}={r[k]}" for k in ("collective", "workload", "bytes", "model") if k in r
    ).strip()
    samples = r.get("samples_s") or {}
    out = {}
    for key, value in r.items():
        for suffix, scale in (("_us", 1e-6), ("_ms", 1e-3)):
            if key.endswith(suffix) and isinstance(value, (int, float)):
                name = key[: -len(suffix)]
                seen = samples.get(name)
                low, high = (min(seen), max(seen)) if seen else (None, None)
                out[f"allreduce {section} {label} {name}".replace("  ", " ")] = Row(
                    value * scale, low, high
                )
    return out


def compare(a: dict, b: dict, a_name: str = "A", b_name: str = "B") -> str:
    """The side-by-side table of the rows two bench documents share, and the rows only one has."""
    first, second = rows_of(a), rows_of(b)
    shared = [name for name in first if name in second]
    width = max([len("row"), *(len(n) for n in shared)])
    lines = [
        f"{a_name}: {_where(a)}",
        f"{b_name}: {_where(b)}",
        "",
        f"{'row':<{width}} {a_name + ' ms':>12} {a_name + ' min-max':>19} {b_name + ' ms':>12} "
        f"{b_name + ' min-max':>19} {b_name + '/' + a_name:>7}  verdict",
    ]
    for name in shared:
        x, y = first[name], second[name]
        lines.append(
            f"{name:<{width}} {x.median * 1e3:12.4f} {_range(x):>19} {y.median * 1e3:12.4f} "
            f"{_range(y):>19} {y.median / x.median:7.3f}  {_verdict(x, y, a_name, b_name)}"
        )
    for who, only in ((a_name, set(first) - set(second)), (b_name, set(second) - set(first))):
        if only:
            lines.append(f"only in {who}: {', '.join(sorted(only))}")
    lines.append(
        f"ms: each row's median; min-max: its fastest and slowest iteration (raw MPI rows: the "
        f"fastest and slowest rank's mean); {b_name}/{a_name}: the ratio of medians (above 1: "
        f"{b_name} slower); verdict: faster or slower only where the two ranges do not overlap"
    )
    for doc, who in ((a, a_name), (b, b_name)):
        if (doc.get("meta") or {}).get("quick"):
            lines.append(f"{who} is a --quick smoke test: its figures are too few to compare")
    return "\n".join(lines)


def _where(doc: dict) -> str:
    meta = doc.get("meta") or {}
    env = meta.get("environment") or {}
    library = env.get("mpi_library") or meta.get("mpi_library", "?")
    parts = [f"{meta.get('ranks', '?')} ranks", " ".join(str(library).split())]
    if env:
        parts += [f"{env['nodes']} node(s)", env["cpu"], f"mpisync {env['versions']['mpisync']}"]
    parts.append(str(meta.get("date", "")))
    return ", ".join(p for p in parts if p)


def _range(row: Row) -> str:
    if row.low is None or row.high is None:
        return "-"
    return f"{row.low * 1e3:.4f}-{row.high * 1e3:.4f}"


def _verdict(x: Row, y: Row, a_name: str, b_name: str) -> str:
    if None in (x.low, x.high, y.low, y.high):
        return "no spread"
    assert x.low is not None and x.high is not None and y.low is not None and y.high is not None
    if y.high < x.low:
        return f"{b_name} faster"
    if y.low > x.high:
        return f"{b_name} slower"
    return "within spread"


def main(paths: list) -> int:
    """Print the comparison of two JSON files written by ``mpisync bench --json``."""
    docs = []
    for path in paths:
        with open(path) as f:
            docs.append(_json.load(f))
    print(compare(docs[0], docs[1], "A", "B"))
    return 0
