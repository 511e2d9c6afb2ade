"""Check the Slurm stage's job output (ci/slurm.sh): every rank ran in one world of N processes,
all ranks hold the same state, and a resumed job starts from the state the first job saved.

    python ci/slurm_check.py train --ranks N FRESH.out RESUMED.out   (examples/slurm_train.sbatch)
    python ci/slurm_check.py ddp --ranks N DDP.out                   (examples/slurm_ddp.sbatch)

Prints each rank's digests, then one PASS or FAIL line per job; exits 1 on any failure. A job
whose tasks each ran alone (srun without an MPI plugin) prints "rank 0/1" N times: it fails here.
"""

from __future__ import annotations

import argparse
import re
import sys

# examples/train_resume.py and examples/ddp_train.py, one line per rank
TRAIN = re.compile(
    r"rank (?P<rank>\d+)/(?P<size>\d+): (?P<how>fresh start|resumed from \S+); synced state "
    r"(?P<start>\w+); after \d+ steps loss \S+, state (?P<end>\w+); identical on every rank: "
    r"(?P<same>True|False)"
)
DDP = re.compile(
    r"rank (?P<rank>\d+)/(?P<size>\d+): \d+ weights identical on every rank: (?P<same>True|False);"
    r" digest (?P<end>[0-9a-f]+)"
)


def read_ranks(path: str, pattern: re.Pattern) -> list[dict]:
    """Every rank's result line in a job's output, as dicts (wherever it is: two tasks' output
    may share a line)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return [m.groupdict() for m in pattern.finditer(f.read())]


def problems(rows: list[dict], ranks: int) -> list[str]:
    """What is wrong with one job's rank lines: ranks 0..N-1 once each in a world of N, every
    rank reporting identical state, one final digest."""
    found = []
    seen = sorted(int(r["rank"]) for r in rows)
    if seen != list(range(ranks)):
        found.append(f"expected ranks 0..{ranks - 1} once each, got ranks {seen}")
    sizes = sorted({int(r["size"]) for r in rows})
    if sizes != [ranks]:
        found.append(f"expected one world of {ranks} processes, got world sizes {sizes}")
    if any(r["same"] != "True" for r in rows):
        found.append("a rank reports that the ranks' states differ")
    for key in ("start", "end"):
        digests = sorted({r[key] for r in rows if key in r})
        if len(digests) > 1:
            found.append(f"{key} digests differ between ranks: {', '.join(digests)}")
    return found


def show(name: str, rows: list[dict]) -> None:
    for r in sorted(rows, key=lambda r: int(r["rank"])):
        start = f"synced {r['start']}  " if "start" in r else ""
        print(f"  {name}: rank {r['rank']}/{r['size']}  {start}final {r['end']}")


def verdict(name: str, found: list[str]) -> bool:
    print(f"{'PASS' if not found else 'FAIL'} {name}" + "".join(f"\n  - {p}" for p in found))
    return not found


def check_train(fresh_path: str, resumed_path: str, ranks: int) -> bool:
    fresh, resumed = read_ranks(fresh_path, TRAIN), read_ranks(resumed_path, TRAIN)
    show("fresh", fresh)
    show("resumed", resumed)
    ok = verdict(f"slurm_train fresh start, {ranks} ranks", problems(fresh, ranks))
    found = problems(resumed, ranks)
    if any(not r["how"].startswith("resumed from") for r in resumed):
        found.append("the second job did not resume from the checkpoint")
    saved = {r["end"] for r in fresh}
    started = {r["start"] for r in resumed}
    if len(saved) == 1 and started and started != saved:
        found.append(f"resumed from state {', '.join(sorted(started))}, saved {saved.pop()}")
    return verdict(f"slurm_train resumed from the saved state, {ranks} ranks", found) and ok


def check_ddp(path: str, ranks: int) -> bool:
    rows = read_ranks(path, DDP)
    show("ddp", rows)
    return verdict(f"slurm_ddp, {ranks} ranks", problems(rows, ranks))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=["train", "ddp"])
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("outputs", nargs="+")
    args = parser.parse_args(argv)
    if args.job == "train" and len(args.outputs) == 2:
        ok = check_train(*args.outputs, args.ranks)
    elif args.job == "ddp" and len(args.outputs) == 1:
        ok = check_ddp(args.outputs[0], args.ranks)
    else:
        parser.error("train takes FRESH.out RESUMED.out, ddp takes DDP.out")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
