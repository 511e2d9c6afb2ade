"""The rows of a ``side_by_side.py`` table in four groups, each with its median ratio and range.

    python benchmarks/side_by_side_groups.py benchmarks/results/.../side-by-side-OLD-NEW.txt

Groups: raw ``MPI_Bcast`` (the OSU sweep: no mpisync code, so its spread is the machine's
noise), other libraries' rows (per-tensor loops, ``Ibcast``, flat collectives, gloo,
``MPI_Allreduce``), mpisync's broadcast rows (``ParamSync``, ``sync_params``, the sweeps) and
mpisync's all-reduce rows (``GradSync``, ``allreduce``, the torch backend). Rows outside
0.95-1.05 are listed.
"""

from __future__ import annotations

import statistics
import sys

_MPISYNC_BROADCAST = ("ParamSync", "sync_params")
_MPISYNC_ALLREDUCE = ("GradSync", "allreduce, one-shot", " mpisync", "checked", "mpisync ")


def group_of(row: str) -> str:
    """The group of one row name."""
    if row.startswith("osu "):
        return "raw MPI_Bcast (OSU sweep)"
    if row.startswith("sweep "):
        return "mpisync broadcast"
    if row.startswith("allreduce "):
        if any(word in row for word in _MPISYNC_ALLREDUCE):
            return "mpisync all-reduce"
        return "other libraries"
    strategy = row.split(": ", 1)[-1]
    if strategy.startswith(_MPISYNC_BROADCAST):
        return "mpisync broadcast"
    return "other libraries"


def read(path: str) -> dict:
    """``{row: new/old}`` from a table ``side_by_side.py`` printed."""
    rows = {}
    with open(path) as table:
        lines = table.readlines()
    for line in lines:
        parts = line.rstrip("\n").rsplit(None, 3)
        if len(parts) != 4 or line.startswith(("#", "row ")):
            continue
        try:
            rows[parts[0]] = float(parts[3])
        except ValueError:
            continue
    return rows


def main(argv: list) -> int:
    """Print each group's count, median and range, then the rows outside 5%."""
    rows = read(argv[0])
    groups: dict = {}
    for row, ratio in rows.items():
        groups.setdefault(group_of(row), []).append((ratio, row))
    for name, members in groups.items():
        ratios = [r for r, _ in members]
        print(
            f"{name:32s} {len(ratios):4d} rows  median {statistics.median(ratios):.3f}  "
            f"range {min(ratios):.3f}-{max(ratios):.3f}"
        )
    for name, members in groups.items():
        if name.startswith("mpisync"):
            outside = sorted(m for m in members if not 0.95 <= m[0] <= 1.05)
            print(f"\n{name}: {len(outside)} of {len(members)} rows outside 0.95-1.05")
            for ratio, row in outside:
                print(f"  {ratio:.3f}  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
