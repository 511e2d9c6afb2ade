"""torch's contract tests for a torch.distributed backend (``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py``), one MPI process per rank.

    HYDRA_LAUNCHER=fork MPIEXEC_TIMEOUT=900 timeout 960 \\
        mpiexec -n 3 python ci/torch_contract/harness.py --backend gloo --out gloo_3.json

This is how torch itself ran these tests for its MPI backend (``mpiexec -n 3`` on
``TestMPIWithFork``), with what torch's spawn path does for each test
(``TestDistBackend._run``): a fresh temporary directory and ``file://`` init file,
``init_process_group`` with the test's timeout, torch's file barrier, the seed,
the test method. unittest's skip attributes are honoured (torch decides those
skips by the backend's name when the module is imported); ``sys.exit`` skips
(``skip_if_lt_x_gpu`` and the like) are mapped through ``TEST_SKIPS``.

Every rank sends its outcome to rank 0, which records the test's verdict in
``<out>.jsonl``: pass (every rank passed), skip (every rank skipped), fail (a
rank failed), or hang (a rank gave no outcome by ``--per-test-timeout``, or
within ``--fail-grace`` of another rank's failure). A hang aborts the job (a
collective cannot be cancelled); a job that dies mid-test leaves the test's name
in ``<out>.current``, recorded as a crash by the next ``--resume``. ``driver.py``
restarts jobs until every test has a verdict; ``compare.py`` compares backends.

A backend other than gloo is registered by importing ``--register`` modules and
declared to torch's tests with ``--feature`` (names added to
``DistTestCases.backend_feature``); ``--admit`` runs tests that torch skips by
the backend's name only (e.g. "Only MPI supports all_to_all").
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import sys
import threading
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import records  # noqa: E402  (this directory's helper module)

TAG_OUTCOME = 7701
# The skip reasons --admit may override: torch's gates on the backend's name, not on hardware.
NAME_GATES = ("Only MPI supports",)


def parse_args(argv=None) -> argparse.Namespace:
    """The harness's options (parsed before torch's test modules read ``sys.argv``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="gloo", help="torch.distributed backend name")
    p.add_argument("--register", action="append", default=[], help="module to import first")
    p.add_argument("--feature", action="append", default=[], help="DistTestCases feature")
    p.add_argument("--gate-as", default=None, help="name torch's import-time gates see")
    p.add_argument("--admit", action="append", default=[], help="run these despite name gates")
    p.add_argument("--filter", action="append", default=[], help="run tests matching any")
    p.add_argument("--exclude", action="append", default=[], help="leave out tests matching")
    p.add_argument("--per-test-timeout", type=float, default=120.0)
    p.add_argument("--fail-grace", type=float, default=10.0)
    p.add_argument("--out", default="results.json")
    p.add_argument("--resume", action="store_true", help="skip the tests <out>.jsonl records")
    p.add_argument("--max-tests", type=int, default=0, help="at most this many (0: all)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads per rank")
    p.add_argument("--temp-root", default=None, help="shared directory for TEMP_DIR")
    p.add_argument("--list", action="store_true", help="print the selected tests and exit")
    p.add_argument("--quiet", action="store_true", help="no line per test")
    return p.parse_args(argv)


def _sleep_wait(request, poll: float = 0.002) -> None:
    """Wait for an MPI request without spinning a core (MPICH busy-polls in Wait)."""
    while not request.Test():
        time.sleep(poll)


def set_environment(comm, args) -> str:
    """The environment torch's test module reads when imported; returns the shared temp root."""
    import socket
    import tempfile

    root = port = None
    if comm.rank == 0:
        root = tempfile.mkdtemp(prefix="torch_contract_", dir=args.temp_root)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    root, port = comm.bcast((root, port), root=0)
    os.environ.update(
        BACKEND=args.gate_as or args.backend,
        WORLD_SIZE=str(comm.size),
        TEMP_DIR=root,
        INIT_METHOD="file://" + os.path.join(root, "shared_init_file"),
        MASTER_PORT=str(port),
        RANK=str(comm.rank),
    )
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("PYTORCH_PRINT_REPRO_ON_FAILURE", "0")
    return root


def load_tests(args):
    """``(test case class, distributed_test module, common_distributed, selected names)``."""
    for module in args.register:
        importlib.import_module(module)
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from torch.testing._internal import common_distributed as cd

    gate = args.gate_as or args.backend
    for feature in args.feature:
        cd.DistTestCases.backend_feature.setdefault(feature, set()).add(gate)
    from torch.testing._internal.distributed import distributed_test as dt

    if args.gate_as:  # the gates saw the other name; the test bodies see the real one
        dt.BACKEND = args.backend
    base = dt.DistributedTest._DistTestBase

    class TestDistBackendMPIExec(dt.TestDistBackend, base):  # type: ignore[misc, valid-type]
        """torch's TestDistBackendWithSpawn, with processes from mpiexec."""

    every = sorted(n for n in dir(base) if n.startswith("test") and callable(getattr(base, n)))
    names = [n for n in every if not args.filter or any(re.search(p, n) for p in args.filter)]
    names = [n for n in names if not any(re.search(p, n) for p in args.exclude)]
    return TestDistBackendMPIExec, dt, cd, names, len(every)


def skip_reason(case, name: str, admit: list) -> str | None:
    """unittest's own skip check (torch makes it before it spawns anything), or None."""
    method = getattr(type(case), name)
    skipped = getattr(type(case), "__unittest_skip__", False) or getattr(
        method, "__unittest_skip__", False
    )
    if not skipped:
        return None
    why = getattr(type(case), "__unittest_skip_why__", "") or getattr(
        method, "__unittest_skip_why__", ""
    )
    forced = any(re.search(p, name) for p in admit) and why.startswith(NAME_GATES)
    return None if forced else (why or "skipped")


def run_one(env, idx: int, name: str) -> dict:
    """Run test ``name`` on this rank; its outcome."""
    case_class, dt, cd, args, rank, size, root = env
    import torch.distributed as dist
    from torch.testing._internal import common_utils

    tdir = os.path.join(root, f"t{idx:04d}")
    os.environ["TEMP_DIR"] = tdir
    dt.INIT_METHOD = "file://" + os.path.join(tdir, "init_dir", "shared_init_file")
    dt.Barrier.barrier_id = 0
    start = time.time()
    outcome: dict = {"status": "pass"}
    try:
        case = case_class(name)
        case.rank = rank
        case.file_name = os.path.join(tdir, "init_file")
        why = skip_reason(case, name, args.admit)
        if why is not None:
            return {"status": "skip", "reason": why, "gated": True, "duration": 0.0}
        timeout = dt.timedelta(seconds=dt.CUSTOM_PG_TIMEOUT.get(name, dt.default_pg_timeout))
        dist.init_process_group(
            init_method=case.init_method,
            backend=args.backend,
            world_size=size,
            rank=rank,
            timeout=timeout,
        )
        case._barrier()
        common_utils.set_rng_seed(common_utils.SEED)  # the default of releases that have one
        getattr(case, name)()
    except unittest.SkipTest as exc:
        outcome = {"status": "skip", "reason": str(exc) or "unittest.SkipTest"}
    except SystemExit as exc:
        outcome = records.exit_outcome(exc, cd.TEST_SKIPS, traceback.format_exc())
    except BaseException as exc:  # noqa: BLE001 - a test's failure, whatever it is
        lines = str(exc).strip().splitlines()
        summary = f"{type(exc).__name__}: {lines[0][:400] if lines else ''}"
        outcome = {"status": "fail", "summary": summary, "traceback": traceback.format_exc()}
    outcome["duration"] = round(time.time() - start, 3)
    if outcome["status"] == "fail" and dist.is_initialized():
        try:  # as torch's child process exits: peers blocked on this rank fail sooner
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    return outcome


class Verdicts:
    """Rank 0's view of the test in progress: outcomes as they arrive, the deadlines, the
    verdict (the watchdog thread and the main thread share it under ``lock``)."""

    def __init__(self, comm, args, jsonl: str, current: str, job: str):
        self.comm, self.args, self.jsonl, self.current, self.job = comm, args, jsonl, current, job
        self.lock = threading.Lock()
        self.name: str | None = None
        self.idx, self.start, self.first_fail = -1, 0.0, None
        self.outcomes: dict = {}
        self.in_test = self.decided = False

    def begin(self, idx: int, name: str) -> None:
        with self.lock:
            self.idx, self.name, self.start = idx, name, time.time()
            self.outcomes, self.first_fail, self.in_test, self.decided = {}, None, True, False

    def poll(self) -> None:
        """Take the outcomes other ranks sent (call with ``lock`` held)."""
        from mpi4py import MPI

        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_OUTCOME, status=status):
            message = self.comm.recv(source=status.Get_source(), tag=TAG_OUTCOME)
            if message["idx"] == self.idx:
                self.note(status.Get_source(), message["outcome"])

    def note(self, rank: int, outcome: dict) -> None:
        self.outcomes[rank] = outcome
        if outcome["status"] == "fail" and self.first_fail is None:
            self.first_fail = time.time()

    def overdue(self) -> tuple:
        """``(past the per-test deadline, past the grace after a failure)``."""
        now = time.time()
        late = now - self.start > self.args.per_test_timeout
        failed = self.first_fail is not None and now - self.first_fail > self.args.fail_grace
        return late, failed

    def record(self, record: dict) -> None:
        record.update(world_size=self.comm.size, backend=self.args.backend, job=self.job)
        records.append_jsonl(self.jsonl, record)
        if not self.args.quiet:
            extra = f"  {record.get('reason', '')[:160]}" if record["status"] != "pass" else ""
            print(f"[harness] {record['status']:5s} {record['name']}{extra}", flush=True)

    def abort_with(self, record: dict) -> None:
        self.record(record)
        if os.path.exists(self.current):
            os.remove(self.current)
        sys.stdout.flush()
        sys.stderr.flush()
        self.comm.Abort(3)


def watchdog(verdicts: Verdicts, rank: int) -> None:
    """Rank 0: record a hang and abort the job; other ranks: abort long after the deadline."""
    args = verdicts.args
    hard = args.per_test_timeout + args.fail_grace + 60.0
    while True:
        time.sleep(0.5)
        with verdicts.lock:
            if not verdicts.in_test or verdicts.decided:
                continue
            if rank != 0:
                if time.time() - verdicts.start > hard:
                    verdicts.comm.Abort(4)
                continue
            verdicts.poll()
            late, failed = verdicts.overdue()
            if late or failed:
                verdicts.decided = True
                record = records.agree(verdicts.name, verdicts.outcomes, verdicts.comm.size, late)
                verdicts.abort_with(record)


def collect(verdicts: Verdicts, outcome: dict) -> dict:
    """Rank 0 after its own test: every rank's outcome (or the abort), then the verdict."""
    with verdicts.lock:
        verdicts.in_test = False
        verdicts.note(0, outcome)
    while True:
        with verdicts.lock:
            if verdicts.decided:  # the watchdog got there first: it aborts the job
                time.sleep(3600)
            verdicts.poll()
            if len(verdicts.outcomes) == verdicts.comm.size:
                verdicts.decided = True
                return records.agree(verdicts.name, verdicts.outcomes, verdicts.comm.size)
            late, failed = verdicts.overdue()
            if late or failed:
                verdicts.decided = True
                verdicts.abort_with(
                    records.agree(verdicts.name, verdicts.outcomes, verdicts.comm.size, late)
                )
        time.sleep(0.005)


def run_all(comm, env, verdicts: Verdicts, todo: list) -> None:
    """Every test of ``todo`` on every rank, one at a time."""
    import torch.distributed as dist

    root = env[-1]
    for idx, name in enumerate(todo):
        if comm.rank == 0:
            records.prepare_test_dir(os.path.join(root, f"t{idx:04d}"))
            records.write_json(verdicts.current, {"name": name, "job": verdicts.job})
        _sleep_wait(comm.Ibarrier())
        verdicts.begin(idx, name)
        outcome = run_one(env, idx, name)
        if comm.rank != 0:
            with verdicts.lock:
                verdicts.in_test = False
            _sleep_wait(comm.isend({"idx": idx, "outcome": outcome}, dest=0, tag=TAG_OUTCOME))
        else:
            verdicts.record(collect(verdicts, outcome))
            os.remove(verdicts.current)
        _sleep_wait(comm.Ibarrier())
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001
                pass
        gc.collect()  # the test's groups and stores go while their files still exist


def main() -> int:
    """One job: run the selected tests not yet recorded, write the summary on rank 0."""
    args = parse_args()
    sys.argv = sys.argv[:1]  # torch's common_utils parses the command line itself
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = os.path.abspath(args.out)
    jsonl, current = out + ".jsonl", out + ".current"
    root = set_environment(comm, args)
    case_class, dt, cd, names, total = load_tests(args)
    if args.list:
        if comm.rank == 0:
            print("\n".join(names))
        return 0
    todo, job = records.todo(args, names, jsonl, current) if comm.rank == 0 else (None, None)
    todo, job = comm.bcast((todo, job), root=0)
    verdicts = Verdicts(comm, args, jsonl, current, job)
    threading.Thread(target=watchdog, args=(verdicts, comm.rank), daemon=True).start()
    gc.collect()
    gc.freeze()  # the per-test gc.collect() then scans only what the tests made
    env = (case_class, dt, cd, args, comm.rank, comm.size, root)
    run_all(comm, env, verdicts, todo)
    _sleep_wait(comm.Ibarrier())
    if comm.rank == 0:
        records.summarize(out, jsonl, names, total, args, comm.size)
    if args.temp_root is None:
        _sleep_wait(comm.Ibarrier())
        if comm.rank == 0:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
