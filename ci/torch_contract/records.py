"""The harness's records: a verdict from every rank's outcome, the ``.jsonl`` log of verdicts,
the summary file. Plain Python (no MPI, no torch): ``compare.py`` and the unit tests use it."""

from __future__ import annotations

import json
import os
import time

__all__ = [
    "agree",
    "append_jsonl",
    "exit_outcome",
    "prepare_test_dir",
    "read_jsonl",
    "summarize",
    "todo",
    "write_json",
]


def read_jsonl(path: str) -> list:
    """The records of ``path`` (a line cut short by an abort is left out)."""
    found = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return found


def append_jsonl(path: str, record: dict) -> None:
    """Append ``record`` and make it durable (the job may be aborted next)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_json(path: str, obj) -> None:
    """Write ``obj`` to ``path`` atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _short(text: str | None, n: int = 6000) -> str | None:
    if text is None or len(text) <= n:
        return text
    return text[: n // 3] + "\n...[cut]...\n" + text[-(2 * n) // 3 :]


def agree(name: str, outcomes: dict, size: int, late: bool = False) -> dict:
    """The verdict of test ``name`` from ``{rank: outcome}`` (a missing rank gave no outcome)."""
    missing = sorted(set(range(size)) - set(outcomes))
    statuses = {r: o["status"] for r, o in outcomes.items()}
    record: dict = {
        "name": name,
        "per_rank": {str(r): statuses.get(r, "no-report") for r in range(size)},
        "duration": max((o.get("duration", 0.0) for o in outcomes.values()), default=None),
    }
    failed = sorted(r for r, s in statuses.items() if s == "fail")
    if failed:
        # the rank that failed first is the likeliest cause (the others often fail after it)
        first = min(failed, key=lambda r: (outcomes[r].get("duration", 0.0), r))
        record.update(
            status="fail",
            reason=f"rank {first}: {outcomes[first].get('summary', '')}",
            traceback=_short(outcomes[first].get("traceback")),
        )
        if missing:
            record["note"] = f"ranks {missing} gave no outcome (blocked after the failure)"
    elif missing:
        where = "still inside the test at the deadline" if late else "gave no outcome"
        record.update(status="hang", reason=f"ranks {missing} {where}")
    elif all(s == "pass" for s in statuses.values()):
        record["status"] = "pass"
    elif all(s == "skip" for s in statuses.values()):
        reasons = sorted({o.get("reason", "") for o in outcomes.values()})
        record.update(status="skip", reason=" | ".join(reasons))
        if all(o.get("gated") for o in outcomes.values()):
            record["gated"] = True  # skipped by torch's gates on the backend's name or features
    else:
        record.update(status="mixed", reason=str(sorted(statuses.items())))
    return record


def exit_outcome(exc: SystemExit, skips: dict, trace: str) -> dict:
    """A test's ``sys.exit(code)``: torch's skip decorators exit with ``TEST_SKIPS`` codes."""
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    skip = next((s for s in skips.values() if s.exit_code == code), None)
    if code == 0:
        return {"status": "pass"}
    if skip is not None:
        return {"status": "skip", "reason": skip.message}
    return {"status": "fail", "summary": f"sys.exit({exc.code})", "traceback": trace}


def prepare_test_dir(path: str) -> None:
    """A test's TEMP_DIR, as torch's ``initialize_temp_directories`` makes it."""
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    open(os.path.join(path, "init_file"), "w").close()


def todo(args, names: list, jsonl: str, current: str) -> tuple:
    """``(tests left to run, job id)``; a test left in ``current`` by a job that died is a
    crash."""
    if not args.resume:
        for path in (jsonl, current, os.path.abspath(args.out)):
            if os.path.exists(path):
                os.remove(path)
    done = {r["name"] for r in read_jsonl(jsonl)}
    if args.resume and os.path.exists(current):
        with open(current) as f:
            try:
                left = json.load(f)
            except json.JSONDecodeError:
                left = {}
        if left.get("name") and left["name"] not in done:
            append_jsonl(
                jsonl,
                {
                    "name": left["name"],
                    "status": "crash",
                    "per_rank": {},
                    "duration": None,
                    "reason": "the job ended during this test without a verdict",
                },
            )
            done.add(left["name"])
        os.remove(current)
    left_to_run = [n for n in names if n not in done]
    if args.max_tests > 0:
        left_to_run = left_to_run[: args.max_tests]
    return left_to_run, f"{os.getpid()}-{int(time.time())}"


def summarize(out: str, jsonl: str, names: list, total: int, args, size: int) -> dict:
    """Write ``out``: counts, the passing tests, one record per test (the last of each name)."""
    latest = {r["name"]: r for r in read_jsonl(jsonl)}
    ordered = [latest[n] for n in names if n in latest]
    counts: dict = {}
    for record in ordered:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    summary = {
        "backend": args.backend,
        "gate_as": args.gate_as,
        "features": args.feature,
        "admit": args.admit,
        "world_size": size,
        "selected": len(names),
        "total_in_DistTestBase": total,
        "complete": all(n in latest for n in names),
        "counts": counts,
        "passed": [r["name"] for r in ordered if r["status"] == "pass"],
        "tests": ordered,
    }
    write_json(out, summary)
    return summary
