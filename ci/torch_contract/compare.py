"""torch's contract tests on the ``"mpisync"`` backend beside gloo: the acceptance check.

    python ci/torch_contract/compare.py --ranks 2 3 --out-dir .test-logs/torch-contract

At each number of ranks it runs ``DistributedTest._DistTestBase`` (``driver.py``)
on gloo and on mpisync, prints one table (a row per test that ran anywhere) and
fails if:

- a test gloo passes does not pass on mpisync, among the tests torch admits for
  mpisync (mpisync is declared to torch's tests under its own name with the
  features ``plugin``, ``ddp`` and ``subgroup``; tests torch runs only for a
  backend named gloo stay skipped, and are listed);
- a test that torch runs only for its MPI backend (``--admit``: all_to_all with
  split sizes, which gloo lacks) does not pass on mpisync;
- any test hangs or crashes on mpisync.

``--gate-as-gloo`` adds a report that does not gate: mpisync presented to torch's
import-time gates under gloo's name (so the tests torch runs for gloo only run
too, some of which test gloo itself), with ``MPISYNC_TIMEOUT_ABORT=0`` (the
barrier timeout tests expect a raise, not an abort).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import driver  # noqa: E402  (this directory's modules)

MPISYNC = ["--register", "mpisync.torch", "--feature", "plugin", "--feature", "ddp"]
MPISYNC += ["--feature", "subgroup"]
# Tests torch skips unless the backend is named "mpi" ("Only MPI supports all_to_all").
ADMITTED = "test_all_to_all"
ADMIT = ["--admit", "^" + ADMITTED]
SHORT = {"pass": "pass", "fail": "FAIL", "skip": "-", "hang": "HANG", "crash": "CRASH"}


def verdicts(summary: dict) -> dict:
    """``{test: record}`` of a run's summary."""
    return {r["name"]: r for r in summary.get("tests", [])}


def problems(gloo: dict, mine: dict, n: int, admitted_only_for_mpi: set) -> list:
    """What fails the check at ``n`` ranks, one line each."""
    found = []
    for name, record in sorted(gloo.items()):
        theirs = mine.get(name, {})
        status = theirs.get("status", "missing")
        if record["status"] == "pass" and not theirs.get("gated") and status != "pass":
            found.append(f"{n} ranks: {name}: gloo passes, mpisync {status}")
    for name in sorted(admitted_only_for_mpi):
        status = mine.get(name, {}).get("status")
        if status not in ("pass", "skip"):
            found.append(f"{n} ranks: {name} (torch runs it for MPI only): mpisync {status}")
    for name, record in sorted(mine.items()):
        if record["status"] in ("hang", "crash"):
            found.append(f"{n} ranks: {name}: mpisync {record['status']}")
    return found


def table(runs: dict, ranks: list) -> str:
    """One row per test that ran (was not skipped) in any run."""
    names = sorted({n for v in runs.values() for n, r in v.items() if r["status"] != "skip"})
    columns = [(backend, n) for n in ranks for backend in ("gloo", "mpisync")]
    width = max([len(n) for n in names] + [10])
    head = f"{'test':<{width}} " + " ".join(f"{b + ' ' + str(n):>10}" for b, n in columns)
    lines = [head, "-" * len(head)]
    for name in names:
        cells = [SHORT.get(runs[c].get(name, {}).get("status", ""), "?") for c in columns]
        lines.append(f"{name:<{width}} " + " ".join(f"{c:>10}" for c in cells))
    for backend, n in columns:
        counts: dict = {}
        for record in runs[(backend, n)].values():
            counts[record["status"]] = counts.get(record["status"], 0) + 1
        lines.append(f"{backend} at {n} ranks: {dict(sorted(counts.items()))}")
    return "\n".join(lines)


def not_admitted(runs: dict, ranks: list) -> list:
    """gloo's passes that torch skips for mpisync by name (not part of the check)."""
    return sorted(
        {
            name
            for n in ranks
            for name, record in runs[("gloo", n)].items()
            if record["status"] == "pass" and runs[("mpisync", n)].get(name, {}).get("gated")
        }
    )


def supplementary(runs: dict, a, common: list) -> None:
    """mpisync under gloo's name beside gloo: printed, not gating."""
    os.environ["MPISYNC_TIMEOUT_ABORT"] = "0"
    extra = {}
    for n in a.ranks:
        out = os.path.join(a.out_dir, f"mpisync_as_gloo_{n}.json")
        args = ["--backend", "mpisync", "--register", "mpisync.torch", "--gate-as", "gloo"]
        summary = driver.run(n, out, args + common, a.job_timeout)
        extra[("gloo", n)] = runs[("gloo", n)]
        extra[("mpisync", n)] = verdicts(summary)
    print("\nsupplementary: mpisync presented to torch's gates as gloo (not part of the check)")
    print(table(extra, a.ranks))


def main(argv=None) -> int:
    """Run the matrix, print the table, return 1 if the check fails."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 3])
    p.add_argument("--out-dir", default=".test-logs/torch-contract")
    p.add_argument("--per-test-timeout", default="120")
    p.add_argument("--job-timeout", type=int, default=600)
    p.add_argument("--gate-as-gloo", action="store_true", help="also the report under gloo's name")
    a = p.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    common = ["--per-test-timeout", a.per_test_timeout, *ADMIT]
    runs = {}
    for n in a.ranks:
        for backend, extra in (("gloo", []), ("mpisync", MPISYNC)):
            out = os.path.join(a.out_dir, f"{backend}_{n}.json")
            summary = driver.run(n, out, ["--backend", backend, *extra, *common], a.job_timeout)
            print(f"[torch contract] {backend} at {n} ranks: {summary.get('counts')} in "
                  f"{summary['wall_time_s']} s", flush=True)  # fmt: skip
            runs[(backend, n)] = verdicts(summary)
    print(table(runs, a.ranks))
    skipped = not_admitted(runs, a.ranks)
    print(f"gloo passes torch skips for mpisync by name ({len(skipped)}): {', '.join(skipped)}")
    found = []
    for (backend, n), verdict in runs.items():  # a run that ran nothing checks nothing
        if not any(r["status"] == "pass" for r in verdict.values()):
            found.append(f"{n} ranks: {backend}: no test passed (see its log in {a.out_dir})")
    for n in a.ranks:
        mine = runs[("mpisync", n)]
        only_mpi = {k for k, r in mine.items() if k.startswith(ADMITTED) and not r.get("gated")}
        found += problems(runs[("gloo", n)], runs[("mpisync", n)], n, only_mpi)
    if a.gate_as_gloo:
        supplementary(runs, a, common)
    for line in found:
        print(f"[torch contract] FAILED {line}")
    print(f"[torch contract] {'FAILED' if found else 'passed'}", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
