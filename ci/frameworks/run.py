"""The frameworks stage: each framework's own code path on gloo and on mpisync, bit for bit.

Every job is one script of this folder run twice under ``mpiexec -n N`` (bounded by
``MPIEXEC_TIMEOUT`` and a subprocess timeout), once with ``gloo`` and once with ``mpisync``; each
rank prints a ``RESULT`` line (a digest of its final parameters' bytes and its losses exactly,
see common.py). A row passes when both runs succeed and their lines are equal. At more than two
ranks a float sum over the ranks depends on its order, which differs between gloo's algorithms
and MPI's: there a row also passes when every rank of each run holds the same parameters and the
two runs differ only by rounding (a relative difference below ``_ROUNDING``); the row says so.
A framework that is not installed is skipped with a line that says so; anything else that fails
fails the stage.

    python ci/frameworks/run.py [--only NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (row name, script, variant, ranks, module the script needs beyond torch)
JOBS = [
    ("DDP + PowerSGD hook", "ddp.py", "powersgd", (2,), None),
    ("DDP + fp16_compress_hook", "ddp.py", "fp16", (2,), None),
    ("DDP static_graph", "ddp.py", "static", (2,), None),
    ("DDP no_sync", "ddp.py", "no-sync", (2,), None),
    ("ZeroRedundancyOptimizer", "zero_redundancy.py", "", (2,), None),
    ("pipelining ScheduleGPipe", "pipelining.py", "", (2,), None),
    ("FSDP2 fully_shard", "fsdp2.py", "", (2, 3), None),
    ("DCP save/load, replicated", "dcp.py", "sync-plain", (2,), None),
    ("DCP async_save/load, replicated", "dcp.py", "async-plain", (2,), None),
    ("DCP save/load, FSDP2", "dcp.py", "sync-fsdp2", (2,), None),
    ("DCP async_save/load, FSDP2", "dcp.py", "async-fsdp2", (2,), None),
    ("DeepSpeed ZeRO-1", "deepspeed_zero.py", "1", (2, 3), "deepspeed"),
    ("DeepSpeed ZeRO-2", "deepspeed_zero.py", "2", (2, 3), "deepspeed"),
    ("DeepSpeed ZeRO-3", "deepspeed_zero.py", "3", (2, 3), "deepspeed"),
    ("Lightning DDPStrategy", "lightning_strategies.py", "ddp", (2,), "lightning"),
    ("Lightning ModelParallel, FSDP2", "lightning_strategies.py", "fsdp2", (2,), "lightning"),
    ("Lightning ModelParallel, TP", "lightning_strategies.py", "tp", (2,), "lightning"),
    ("Accelerate, group made first", "accelerate_ddp.py", "", (2,), "accelerate"),
    ("Hugging Face Trainer, group made first", "hf_trainer.py", "", (2,), "transformers"),
]
BACKENDS = ("gloo", "mpisync")
# Relative difference accepted at more than two ranks (float32 sums in another order).
_ROUNDING = 1e-5
_ports = itertools.count(29500 + os.getpid() % 200 * 10)


def _installed(python: str, module: str) -> bool:
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=300)
    return probe.returncode == 0


def _run_once(args, script: str, variant: str, ranks: int, backend: str, scratch: Path):
    """``(ok, RESULT lines, seconds, output, folder)`` of one mpiexec run."""
    folder = scratch / f"{script}-{variant}-{ranks}-{backend}-{next(_ports)}"
    folder.mkdir(parents=True)
    env = dict(
        os.environ,
        FRAMEWORKS_STORE=str(folder / "store"),
        FRAMEWORKS_TMP=str(folder),
        FRAMEWORKS_PORT=str(next(_ports)),
        MPIEXEC_TIMEOUT=str(args.timeout),
        OMP_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
    )
    command = [args.mpiexec, "-n", str(ranks), args.python, str(HERE / script), backend]
    command += [variant] if variant else []
    start = time.monotonic()
    try:
        proc = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=args.timeout + 30
        )
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output, code = f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out)", -1
    seconds = time.monotonic() - start
    lines = sorted(
        path.read_text().strip() for path in folder.glob("result-*.txt") if path.read_text()
    )
    complete = len(lines) == ranks
    # gloo is the reference, not under test: once every rank wrote its result, a crash while
    # its process ends (seen: "terminate called without an active exception" from gloo's
    # threads at exit) does not fail the row; mpisync's run must also exit cleanly
    ok = complete and (code == 0 or backend == "gloo")
    return ok, lines, seconds, output, folder


def _rounding(runs: dict, ranks: int) -> float | None:
    """The largest relative difference between the two runs' parameters and losses, when every
    rank of each run holds the same parameters (else None)."""
    import torch

    results = {
        b: [torch.load(run[4] / f"result-{r}.pt") for r in range(ranks)] for b, run in runs.items()
    }
    for per_rank in results.values():
        if any(not torch.equal(x["params"], per_rank[0]["params"]) for x in per_rank):
            return None
    worst = 0.0
    for mine, theirs in zip(results["mpisync"], results["gloo"]):
        for key in ("params", "losses"):
            a, b = mine[key].double(), theirs[key].double()
            if a.shape != b.shape:
                return None
            if a.numel():
                scale = max(float(b.abs().max()), 1e-30)
                worst = max(worst, float((a - b).abs().max()) / scale)
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--mpiexec", default=None, help="default: the one beside --python")
    parser.add_argument("--only", nargs="*", default=None, help="rows whose name contains one")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per mpiexec run")
    parser.add_argument("--out", default=None, help="also write the table (Markdown) here")
    args = parser.parse_args()
    if args.mpiexec is None:
        beside = Path(args.python).parent / "mpiexec"
        args.mpiexec = str(beside) if beside.exists() else "mpiexec"
    installed: dict = {}
    rows = ["| framework | ranks | gloo | mpisync | bit-equal |", "|---|---|---|---|---|"]
    failed = 0
    scratch = Path(tempfile.mkdtemp(prefix="mpisync-frameworks-"))
    started = time.monotonic()
    try:
        for name, script, variant, rank_counts, needs in JOBS:
            if args.only and not any(part.lower() in name.lower() for part in args.only):
                continue
            if needs and needs not in installed:
                installed[needs] = _installed(args.python, needs)
            for ranks in rank_counts:
                if needs and not installed[needs]:
                    line = f"| {name} | {ranks} | skipped: {needs} is not installed | | |"
                    print(
                        f"SKIPPED {name} at {ranks} ranks: {needs} is not installed "
                        "(bash ci/setup.sh .venv-frameworks mpich frameworks)",
                        flush=True,
                    )
                    rows.append(line)
                    continue
                runs = {b: _run_once(args, script, variant, ranks, b, scratch) for b in BACKENDS}
                if not runs["gloo"][0]:  # the reference, not under test: once more
                    print(
                        f"gloo failed on {name} at {ranks} ranks; once more:\n"
                        + "\n".join(runs["gloo"][3].splitlines()[-5:]),
                        flush=True,
                    )
                    runs["gloo"] = _run_once(args, script, variant, ranks, "gloo", scratch)
                both = all(r[0] for r in runs.values())
                equal = both and runs["gloo"][1] == runs["mpisync"][1]
                verdict = "yes" if equal else "NO"
                if both and not equal and ranks > 2:
                    worst = _rounding(runs, ranks)
                    if worst is not None and worst < _ROUNDING:
                        equal = True
                        verdict = f"to rounding ({worst:.1e}: {ranks} ranks' sums in another order)"
                cells = [f"{'ok' if r[0] else 'FAILED'} ({r[2]:.1f} s)" for r in runs.values()]
                rows.append(f"| {name} | {ranks} | {cells[0]} | {cells[1]} | {verdict} |")
                print(rows[-1], flush=True)
                if not equal:
                    failed += 1
                    for backend, (ok, lines, _, output, _) in runs.items():
                        print(
                            f"--- {name}, {ranks} ranks, {backend}: "
                            f"{'ok' if ok else 'failed'}; its RESULT lines:",
                            flush=True,
                        )
                        print("\n".join(lines) or "(none)")
                        if not ok:
                            print("\n".join(output.splitlines()[-40:]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    table = "\n".join(rows)
    print(
        f"\n{table}\n\nframeworks: {failed} row(s) differ or failed, "
        f"{time.monotonic() - started:.0f} s in all",
        flush=True,
    )
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
