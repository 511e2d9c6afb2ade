"""What torch.distributed refuses, on gloo and on mpisync: a survey, one row per case.

Each case calls one collective with arguments torch or a backend forbids (wrong output sizes,
split sizes that do not add up, dtypes that differ between input and output, an op a dtype does
not have, a list of the wrong length, ...), the same on every rank unless its name ends in
``-one-rank``. For each backend the driver runs the cases under ``mpiexec -n N`` (bounded by
``MPIEXEC_TIMEOUT`` and a subprocess timeout), each rank in its own process, and records on each
rank what the call did: raised (the type, the message's gist), returned (and whether the result
is right), or timed out (the group's timeout, 6 s, ran out: another rank did not take part). After
each case every rank meets at a barrier on ``MPI.COMM_WORLD`` and the group runs an
``all_reduce`` of ones (whether the group still works). A rank that does not reach the barrier
within the group's timeout and a few seconds is hung: the job is aborted and the next job starts
at the next case; so does a job whose group is broken. Each job is bounded by
``MPIEXEC_TIMEOUT=--job-timeout`` (60 s) and a subprocess timeout 10 s longer; the whole survey
takes about 4 minutes at 2 ranks on a 2-core machine, so CI does not run it.

    timeout 900 python ci/torch_forbidden.py [--ranks 2] [--only NAME ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GROUP_TIMEOUT = 6.0  # seconds: the group's timeout on both backends
_GRACE = 6.0  # seconds past the group's timeout after which a rank that did not return is hung


def _cases():
    """``{name: fn(rank, size) -> None or "right"/"WRONG ..."}``: each makes one call."""
    import torch
    import torch.distributed as dist

    R = dist.ReduceOp
    f32, f64 = torch.float32, torch.float64

    def ones(n, dtype=f32):
        return torch.ones(n, dtype=dtype)

    def right(got, want) -> str:
        return "right" if torch.equal(got, want) else f"WRONG {got.tolist()} != {want.tolist()}"

    def noncontig(n, dtype=f32):
        return torch.zeros(2 * n, dtype=dtype)[::2]

    def agit_noncontig_out(rank, size):
        out = noncontig(2 * size)
        dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
        return right(out, torch.arange(size, dtype=f32).repeat_interleave(2))

    def agit_noncontig_in(rank, size):
        out = torch.empty(2 * size)
        source = torch.full((4,), float(rank))[::2]
        dist.all_gather_into_tensor(out, source)
        return right(out, torch.arange(size, dtype=f32).repeat_interleave(2))

    def rst_noncontig_out(rank, size):
        out = noncontig(2)
        dist.reduce_scatter_tensor(out, ones(2 * size))
        return right(out, torch.full((2,), float(size)))

    def ar_noncontig(rank, size):
        tensor = torch.ones(2, 3).t()
        dist.all_reduce(tensor)
        return right(tensor, torch.full((3, 2), float(size)))

    def ar_avg(rank, size):
        tensor = torch.full((2,), float(rank))
        dist.all_reduce(tensor, op=R.AVG)
        return right(tensor, torch.full((2,), (size - 1) / 2))

    def ar_bool(rank, size):
        tensor = torch.tensor([rank == 0, False])
        dist.all_reduce(tensor)
        return right(tensor, torch.tensor([True, False]))

    def ar_int_band(rank, size):
        tensor = torch.tensor([3, 5], dtype=torch.int32)
        dist.all_reduce(tensor, op=R.BAND)
        return right(tensor, torch.tensor([3, 5], dtype=torch.int32))

    def a2as_cross(rank, size):
        # rank r sends 1 row to every rank but expects 2 from each: locally consistent
        dist.all_to_all_single(torch.empty(2 * size), ones(size), [2] * size, [1] * size)

    def bcast_noncontig(rank, size):
        tensor = noncontig(3)
        tensor.fill_(float(rank))
        dist.broadcast(tensor, src=0)
        return right(tensor, torch.zeros(3))

    def rs_mixed(rank, size):
        dist.reduce_scatter(ones(2), [ones(2, f64)] * size)

    def p2p_tag_negative(rank, size):
        if rank == 0:
            dist.send(ones(2), dst=1, tag=-1)
        elif rank == 1:
            dist.recv(torch.empty(2), src=0, tag=-1)

    def p2p_dst_out_of_range(rank, size):
        dist.send(ones(2), dst=size)

    def p2p_self(rank, size):
        out = torch.empty(2)
        works = [dist.isend(torch.full((2,), float(rank)), dst=rank), dist.irecv(out, src=rank)]
        for work in works:
            work.wait()
        return right(out, torch.full((2,), float(rank)))

    def ar_uint16(rank, size):
        tensor = torch.ones(2, dtype=torch.uint16)
        dist.all_reduce(tensor)
        return right(tensor, torch.full((2,), size, dtype=torch.uint16))

    def last_rank(rank, size, bad, good):
        return bad if rank == size - 1 else good

    def premul():
        return dist._make_nccl_premul_sum(2.0)

    def root_only(rank, size, value, default=None):
        return value if rank == 0 else default

    return {
        # all_gather_into_tensor
        "agit-output-too-small": lambda r, s: dist.all_gather_into_tensor(ones(2 * s - 1), ones(2)),
        "agit-output-too-large": lambda r, s: dist.all_gather_into_tensor(ones(2 * s + 1), ones(2)),
        "agit-dtype-differs": lambda r, s: dist.all_gather_into_tensor(ones(2 * s, f64), ones(2)),
        "agit-output-too-small-one-rank": lambda r, s: dist.all_gather_into_tensor(
            ones(2 * s - (r == s - 1)), ones(2)
        ),
        "agit-noncontiguous-output": agit_noncontig_out,
        "agit-noncontiguous-input": agit_noncontig_in,
        "agit-sparse-input": lambda r, s: dist.all_gather_into_tensor(
            ones(2 * s), ones(2).to_sparse()
        ),
        "agit-sparse-input-one-rank": lambda r, s: dist.all_gather_into_tensor(
            ones(2 * s), last_rank(r, s, ones(2).to_sparse(), ones(2))
        ),
        "agit-meta-input": lambda r, s: dist.all_gather_into_tensor(
            ones(2 * s), torch.ones(2, device="meta")
        ),
        # all_gather (list)
        "ag-list-too-short": lambda r, s: dist.all_gather([ones(2)] * (s - 1), ones(2)),
        "ag-list-empty": lambda r, s: dist.all_gather([], ones(2)),
        "ag-output-size-differs": lambda r, s: dist.all_gather([ones(3)] * s, ones(2)),
        "ag-dtype-differs": lambda r, s: dist.all_gather([ones(2, f64)] * s, ones(2)),
        "ag-sparse-input": lambda r, s: dist.all_gather(
            [ones(2) for _ in range(s)], ones(2).to_sparse()
        ),
        "agc-output-lists-too-few": lambda r, s: dist.all_gather_coalesced(
            [[ones(2)]] * (s - 1), [ones(2)]
        ),
        # reduce_scatter_tensor / reduce_scatter
        "rst-input-too-small": lambda r, s: dist.reduce_scatter_tensor(ones(2), ones(2 * s - 1)),
        "rst-dtype-differs": lambda r, s: dist.reduce_scatter_tensor(ones(2), ones(2 * s, f64)),
        "rst-input-too-small-one-rank": lambda r, s: dist.reduce_scatter_tensor(
            ones(2), ones(2 * s - (r == s - 1))
        ),
        "rst-noncontiguous-output": rst_noncontig_out,
        "rst-complex-max": lambda r, s: dist.reduce_scatter_tensor(
            ones(2, torch.complex64), ones(2 * s, torch.complex64), op=R.MAX
        ),
        "rst-band-float": lambda r, s: dist.reduce_scatter_tensor(ones(2), ones(2 * s), op=R.BAND),
        "rs-list-too-short": lambda r, s: dist.reduce_scatter(ones(2), [ones(2)] * (s - 1)),
        "rs-list-empty": lambda r, s: dist.reduce_scatter(ones(2), []),
        "rs-dtype-differs": rs_mixed,
        # all_to_all_single / all_to_all
        "a2as-rows-not-divisible": lambda r, s: dist.all_to_all_single(
            torch.empty(s + 1), ones(s + 1)
        ),
        "a2as-output-size-differs": lambda r, s: dist.all_to_all_single(
            torch.empty(2 * s + 2), ones(2 * s)
        ),
        "a2as-input-splits-sum": lambda r, s: dist.all_to_all_single(
            torch.empty(s), ones(s + 1), [1] * s, [1] * s
        ),
        "a2as-output-splits-sum": lambda r, s: dist.all_to_all_single(
            torch.empty(s + 1), ones(s), [1] * s, [1] * s
        ),
        "a2as-splits-length": lambda r, s: dist.all_to_all_single(
            torch.empty(s + 1), ones(s + 1), [1] * (s + 1), [1] * (s + 1)
        ),
        "a2as-negative-split": lambda r, s: dist.all_to_all_single(
            torch.empty(s), ones(s), [1] * s, [-1, 3] + [1] * (s - 2)
        ),
        "a2as-splits-disagree-with-peers": a2as_cross,
        "a2as-dtype-differs": lambda r, s: dist.all_to_all_single(
            torch.empty(s, dtype=f64), ones(s)
        ),
        "a2a-list-too-short": lambda r, s: dist.all_to_all(
            [torch.empty(1)] * (s - 1), [ones(1)] * (s - 1)
        ),
        "a2a-dtype-differs": lambda r, s: dist.all_to_all(
            [torch.empty(1, dtype=f64) for _ in range(s)], [ones(1)] * s
        ),
        "a2a-sizes-disagree-with-peers": lambda r, s: dist.all_to_all(
            [torch.empty(2) for _ in range(s)], [ones(1)] * s
        ),
        # all_reduce and its ops
        "ar-complex-max": lambda r, s: dist.all_reduce(ones(2, torch.complex64), op=R.MAX),
        "ar-avg": ar_avg,
        "ar-premul-sum": lambda r, s: dist.all_reduce(ones(2), op=premul()),
        "ar-band-float": lambda r, s: dist.all_reduce(ones(2), op=R.BAND),
        "ar-band-int": ar_int_band,
        "ar-bool-sum": ar_bool,
        "ar-float8-sum": lambda r, s: dist.all_reduce(ones(2).to(torch.float8_e4m3fn)),
        "ar-noncontiguous": ar_noncontig,
        "ar-sparse-max": lambda r, s: dist.all_reduce(ones(2).to_sparse(), op=R.MAX),
        "ar-uint16-sum": ar_uint16,
        "ar-meta": lambda r, s: dist.all_reduce(torch.ones(2, device="meta")),
        "ar-meta-one-rank": lambda r, s: dist.all_reduce(
            last_rank(r, s, torch.ones(2, device="meta"), ones(2))
        ),
        "arc-empty-list": lambda r, s: dist.all_reduce_coalesced([]),
        "arc-mixed-dtypes": lambda r, s: dist.all_reduce_coalesced([ones(2), ones(2, f64)]),
        "arc-complex-max": lambda r, s: dist.all_reduce_coalesced(
            [ones(2, torch.complex64)], op=R.MAX
        ),
        "reduce-dst-out-of-range": lambda r, s: dist.reduce(ones(2), dst=s),
        "reduce-band-float": lambda r, s: dist.reduce(ones(2), dst=0, op=R.BAND),
        # broadcast
        "bcast-src-out-of-range": lambda r, s: dist.broadcast(ones(2), src=s),
        "bcast-src-negative": lambda r, s: dist.broadcast(ones(2), src=-1),
        "bcast-noncontiguous": bcast_noncontig,
        "bcast-sparse": lambda r, s: dist.broadcast(ones(2).to_sparse(), src=0),
        "bcast-sparse-one-rank": lambda r, s: dist.broadcast(
            last_rank(r, s, ones(2).to_sparse(), ones(2)), src=0
        ),
        # gather / scatter
        "gather-list-too-short": lambda r, s: dist.gather(
            ones(2), root_only(r, s, [ones(2)] * (s - 1)), dst=0
        ),
        "gather-list-size-differs": lambda r, s: dist.gather(
            ones(2), root_only(r, s, [ones(3)] * s), dst=0
        ),
        "gather-list-on-non-root-one-rank": lambda r, s: dist.gather(
            ones(2), [ones(2)] * s if r == s - 1 else root_only(r, s, [ones(2)] * s), dst=0
        ),
        "gather-dst-out-of-range": lambda r, s: dist.gather(ones(2), None, dst=s),
        "scatter-list-too-short": lambda r, s: dist.scatter(
            ones(2), root_only(r, s, [ones(2)] * (s - 1)), src=0
        ),
        "scatter-list-size-differs": lambda r, s: dist.scatter(
            ones(2), root_only(r, s, [ones(3)] * s), src=0
        ),
        "scatter-no-list-on-root": lambda r, s: dist.scatter(ones(2), None, src=0),
        # point to point
        "p2p-send-to-self": lambda r, s: dist.send(ones(2), dst=r),
        "p2p-recv-from-self": lambda r, s: dist.recv(ones(2), src=r),
        "p2p-tag-negative": p2p_tag_negative,
        "p2p-isend-irecv-self": p2p_self,
        "p2p-dst-out-of-range": p2p_dst_out_of_range,
    }


# -- one job: the cases from --start on, on every rank -------------------------------------------
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:160]


def _outcome(fn, rank: int, size: int) -> dict:
    start = time.monotonic()
    try:
        check = fn(rank, size)
        record = {"what": "returned", "check": check}
    except Exception as exc:  # the survey records whatever the call raised
        record = {"what": "raised", "type": type(exc).__name__, "message": _first_line(exc)}
        record["bases"] = [c.__name__ for c in type(exc).__mro__[1:4]]
    record["seconds"] = round(time.monotonic() - start, 2)
    return record


def _met(comm, seconds: float) -> bool:
    """Whether every rank reached this barrier within ``seconds``."""
    request = comm.Ibarrier()
    deadline = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _worker(args) -> int:
    import datetime

    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    folder = Path(args.dir)
    if args.worker == "mpisync":
        import mpisync.torch

        mpisync.torch.init_process_group(timeout=GROUP_TIMEOUT)
    else:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port}",
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT),
        )
    cases = _cases()
    names = args.names.split(",")
    for index in range(args.start, len(names)):
        name = names[index]
        record = _outcome(cases[name], rank, size)
        (folder / f"{index}.{rank}.json").write_text(json.dumps(record))
        if not _met(comm, GROUP_TIMEOUT + _GRACE):
            _end(comm, 4)  # a rank is hung in the case: the next job goes on after it
        probe = _outcome(lambda r, s: _probe(dist, torch, s), rank, size)
        if not _met(comm, GROUP_TIMEOUT + _GRACE):
            probe = {"what": "hung"}
        (folder / f"{index}.{rank}.probe.json").write_text(json.dumps(probe))
        ok = probe["what"] == "returned" and probe["check"] == "right"
        if not comm.allreduce(int(ok), op=MPI.MIN):
            _end(comm, 5)  # the group is broken: a fresh job for the next case
    dist.destroy_process_group()
    return 0


def _end(comm, code: int) -> None:
    """End the job now (MPI_Abort may return before the launcher's signal arrives)."""
    time.sleep(0.2)
    comm.Abort(code)
    os._exit(code)


def _probe(dist, torch, size: int) -> str:
    tensor = torch.ones(3)
    dist.all_reduce(tensor)
    return "right" if tensor.tolist() == [float(size)] * 3 else f"WRONG {tensor.tolist()}"


# -- the driver: jobs until every case has a row -------------------------------------------------
def _run_backend(args, backend: str, names: list, folder: Path) -> None:
    start, port = 0, 29700 + os.getpid() % 100 * 3
    env = dict(os.environ, MPISYNC_TIMEOUT_ABORT="0", OMP_NUM_THREADS="1")
    env["MPIEXEC_TIMEOUT"] = str(args.job_timeout)
    while start < len(names):
        port += 1
        command = [args.mpiexec, "-n", str(args.ranks), sys.executable, __file__]
        command += ["--worker", backend, "--start", str(start), "--port", str(port)]
        command += ["--dir", str(folder), "--names", ",".join(names)]
        try:
            subprocess.run(command, env=env, capture_output=True, timeout=args.job_timeout + 10)
        except subprocess.TimeoutExpired:
            pass
        done = [i for i in range(start, len(names)) if list(folder.glob(f"{i}.*.json"))]
        last = max(done) if done else start
        if not done:
            (folder / f"{start}.job.json").write_text(json.dumps({"what": "job failed"}))
        start = last + 1


def _short(message: str, width: int = 64) -> str:
    """The gist of an error message: no source-location prefixes, mpisync's problem alone."""
    message = re.sub(r"^(\[[^\]]*\]:?\s*)+", "", message)
    found = re.search(
        r"nothing was posted: (rank \d+ \([a-z_]+\): )?(.*?)(; rank \d+ \(|$)", message
    )
    if found:
        message = found.group(2)
    message = message.replace("`", "'")
    return message if len(message) <= width else message[: width - 3] + "..."


def _cell(folder: Path, index: int, ranks: int) -> tuple:
    """``(what the call did on each rank, whether the group worked afterwards)``."""
    per_rank = []
    for rank in range(ranks):
        path = folder / f"{index}.{rank}.json"
        if not path.exists():
            per_rank.append("hung")
            continue
        record = json.loads(path.read_text())
        if record["what"] == "returned":
            per_rank.append(f"returned ({record['check'] or 'no result to check'})")
        elif record["seconds"] >= GROUP_TIMEOUT - 0.5:
            per_rank.append(f"times out ({record['type']})")
        else:
            per_rank.append(f"{record['type']} `{_short(record['message'])}`")
    if len(set(per_rank)) == 1:
        what = ("every rank: " if ranks > 1 else "") + per_rank[0]
    else:
        what = "; ".join(f"rank {r}: {w}" for r, w in enumerate(per_rank))
    probes = [folder / f"{index}.{rank}.probe.json" for rank in range(ranks)]
    records = [json.loads(p.read_text()) for p in probes if p.exists()]
    fine = len(records) == ranks and all(r.get("check") == "right" for r in records)
    return what.replace("|", "\\|"), "works" if fine else "BROKEN"


def _driver(args) -> int:
    names = [n for n in _cases() if not args.only or any(part in n for part in args.only)]
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="mpisync-forbidden-"))
    cells = {}
    try:
        for backend in args.backends:
            folder = root / backend
            folder.mkdir()
            _run_backend(args, backend, names, folder)
            cells[backend] = [_cell(folder, i, args.ranks) for i in range(len(names))]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    heads = " | ".join(f"{b} | group after" for b in args.backends)
    rows = [f"| case | {heads} |", "|---" * (1 + 2 * len(args.backends)) + "|"]
    for i, name in enumerate(names):
        row = " | ".join(f"{cells[b][i][0]} | {cells[b][i][1]}" for b in args.backends)
        rows.append(f"| {name} | {row} |")
    table = "\n".join(rows)
    print(table)
    print(f"\n{len(names)} cases at {args.ranks} ranks, {time.monotonic() - started:.0f} s")
    if args.out:
        Path(args.out).write_text(table + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--backends", nargs="*", default=["gloo", "mpisync"])
    parser.add_argument("--only", nargs="*", default=None, help="cases whose name contains one")
    parser.add_argument("--out", default=None, help="also write the table (Markdown) here")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--job-timeout", type=int, default=60, help="seconds per mpiexec job")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--names", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return _worker(args) if args.worker else _driver(args)


if __name__ == "__main__":
    sys.exit(main())
