"""Run ``harness.py`` under mpiexec until every selected test has a verdict.

    python ci/torch_contract/driver.py -n 3 --out gloo_3.json -- --backend gloo

A job ends early when a test hangs (the harness records it and aborts the job)
or a rank dies (the next job records a crash); each next job resumes after the
recorded tests. Every job is bounded by ``MPIEXEC_TIMEOUT`` and ``timeout``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

__all__ = ["run"]


def _count(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def _complete(out: str) -> bool:
    try:
        with open(out) as f:
            return bool(json.load(f).get("complete"))
    except (OSError, json.JSONDecodeError):
        return False


def _job(n: int, out: str, harness_args: list, job_timeout: int, log) -> int:
    temp = tempfile.mkdtemp(prefix="torch_contract_job_")
    command = [
        "timeout", "-k", "10", str(job_timeout + 30),
        "mpiexec", "-n", str(n),
        sys.executable, os.path.join(HERE, "harness.py"),
        "--out", out, "--resume", "--quiet", "--temp-root", temp, *harness_args,
    ]  # fmt: skip
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(job_timeout))
    env.setdefault("HYDRA_LAUNCHER", "fork")
    env.setdefault("OMP_NUM_THREADS", "1")
    log.write(f"\n===== {' '.join(command)}\n")
    log.flush()
    try:
        return subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def run(n: int, out: str, harness_args: list, job_timeout: int = 900, max_jobs: int = 30) -> dict:
    """Jobs of ``harness.py`` at ``n`` ranks until ``out`` is complete; its summary."""
    out = os.path.abspath(out)
    for suffix in ("", ".jsonl", ".current", ".log"):
        if os.path.exists(out + suffix):
            os.remove(out + suffix)
    start, last, stalls, jobs = time.monotonic(), -1, 0, 0
    with open(out + ".log", "a") as log:
        while jobs < max_jobs:
            jobs += 1
            rc = _job(n, out, harness_args, job_timeout, log)
            recorded = _count(out + ".jsonl")
            if rc == 0 and _complete(out):
                break
            stalls = stalls + 1 if recorded == last and not os.path.exists(out + ".current") else 0
            if stalls >= 2:
                break  # no progress, and nothing to blame: do not loop for ever
            last = recorded
            if os.path.exists(out):
                os.remove(out)  # a summary from an earlier job is stale
    summary: dict = {}
    if os.path.exists(out):
        with open(out) as f:
            summary = json.load(f)
    summary.update(wall_time_s=round(time.monotonic() - start, 1), mpiexec_jobs=jobs)
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def main(argv=None) -> int:
    """Command line: ``-n N --out PATH -- <harness options>``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--job-timeout", type=int, default=900)
    a = p.parse_args(argv)
    summary = run(a.n, a.out, rest, a.job_timeout)
    print(f"[driver] {summary.get('counts')} in {summary['wall_time_s']} s", flush=True)
    return 0 if summary.get("complete") else 1


if __name__ == "__main__":
    sys.exit(main())
