"""``mpisync bench``: the raw MPI rows by OSU's method, the workloads with strategies and their
limit row side by side, sweeps, and (``--allreduce``) the all-reduce rows of
:mod:`mpisync.tools.bench.allreduce`. What each column means: docs/performance.md."""

from __future__ import annotations

import argparse as _argparse
import datetime as _datetime
import importlib.util as _importlib_util
from typing import Any

import numpy as _np
from mpi4py import MPI

import mpisync

from ... import config as _config
from ..._runtime import mpilib as _mpilib
from .. import progressbar as _progress
from ..workloads import WORKLOADS, make_params, workload
from . import environment as _environment
from . import limits as _limits
from . import memory as _memory
from . import osu as _osu
from . import output as _output
from . import strategies as _strategies
from .timing import measure_interleaved

__all__ = ["run", "parser", "main"]


def _torch_available() -> bool:
    # find_spec, not import: importing the suite must not load torch (a CuPy-only GPU bench imports
    # it)
    return _importlib_util.find_spec("torch") is not None


_TORCH = ",resnet50-torch" if _torch_available() else ""
QUICK: dict[str, Any] = {
    "workloads": "resnet50,many-small",
    "iterations": 5,
    "warmup": 1,
    "osu_max": 1 << 20,
    "osu_scale": 0.05,
    "osu_ops": "bcast,allreduce,reduce,allgather",
    "sweep_concurrency": "1,4,16",
    "sweep_fusion": "0,65536,1048576",
    "allreduce_max": 1 << 20,
    "allreduce_iterations": 5,
    "allreduce_sets": "",
}
FULL: dict[str, Any] = {
    "workloads": ",".join(WORKLOADS) + _TORCH,
    "iterations": 11,
    "warmup": 2,
    "osu_max": 1 << 26,
    "osu_scale": 1.0,
    "osu_ops": "bcast,allreduce,reduce,allgather",
    "sweep_concurrency": "1,2,4,8,16,32",
    "sweep_fusion": "0,16384,65536,262144,1048576,4194304",
    "allreduce_max": 1 << 26,
    "allreduce_iterations": 40,
    "allreduce_sets": "",
}
# the torch backend's rows (sweep, ddp, collectives, check) need torch: gloo beside mpisync
ALLREDUCE_ROWS = ("sweep", "grads", "ddp", "collectives", "check")


class _Parser(_argparse.ArgumentParser):
    """Prints its help, usage and errors on rank 0 only: every rank parses the same arguments, and
    ``mpiexec -n 2 mpisync bench --help`` should print the help once."""

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.rank == 0:
            super()._print_message(message, file)


LIMIT = "limit (local copies)"  # the label of the limit row in the workload tables


def parser() -> _argparse.ArgumentParser:
    """The argument parser of ``mpisync bench``."""
    p = _Parser(
        prog="mpisync bench",
        description=(
            "Broadcast (and, with --allreduce, all-reduce) microbenchmarks; run under mpiexec, "
            "e.g. `mpiexec -n 2 mpisync bench --quick`. The raw MPI rows follow OSU's method "
            "(each rank's mean latency, min/avg/max across ranks); every other row is the median "
            "over iterations of the slowest rank's time, beside a limit row (the same bytes as "
            "local memory copies on every rank's core). Each table says what its columns mean; "
            "docs/performance.md says how each figure is made."
        ),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 2 workloads, 5 iterations, raw MPI rows to 1 MiB at 5%% of OSU's "
        "iteration counts (under a minute at 2 ranks); its figures are too few to compare "
        "clusters with (the full run: minutes)",
    )
    p.add_argument(
        "--workloads",
        help=f"comma-separated, from {', '.join(WORKLOADS)}, each also as NAME-torch (torch CPU "
        "tensors, one allocation per tensor)",
    )
    p.add_argument("--iterations", type=int, help="timed iterations per measurement")
    p.add_argument("--warmup", type=int, help="untimed iterations first")
    p.add_argument("--root", type=int, default=0)
    p.add_argument("--osu-max", type=int, help="largest size of the raw MPI rows, bytes")
    p.add_argument(
        "--osu-scale", type=float, help="fraction of OSU's iteration counts (1000/100 per size)"
    )
    p.add_argument(
        "--osu-ops",
        type=_osu_ops,
        help=f"raw MPI rows, comma-separated from {', '.join(_osu.OPERATIONS)} (default: all)",
    )
    p.add_argument("--no-osu", action="store_true", help="skip the raw MPI rows")
    p.add_argument(
        "--no-ibcast",
        action="store_true",
        help="no Ibcast and overlap columns in the Bcast rows (not part of osu_bcast; timed "
        "from Python)",
    )
    p.add_argument(
        "--no-sweep", action="store_true", help="skip the max_concurrent / fusion_bytes sweeps"
    )
    p.add_argument("--sweep-workloads", default="resnet50,many-small")
    p.add_argument("--sweep-concurrency", help="max_concurrent values, comma-separated")
    p.add_argument("--sweep-fusion", help="fusion_bytes values, comma-separated")
    p.add_argument(
        "--allreduce",
        nargs="?",
        const=",".join(ALLREDUCE_ROWS),
        metavar="ROWS",
        help="also the all-reduce rows, comma-separated from sweep (the torch backend's "
        "all_reduce beside gloo and Allreduce, size by size), grads (GradSync on ResNet-50, "
        "BERT-base, 5000 x 400 B), ddp (a DDP step beside gloo), collectives (every "
        "torch.distributed collective beside gloo, DDP's start-up broadcast among them, at "
        "1 KiB, 1 MiB, 25 MiB), check (the backend's argument check's cost); alone: all five",
    )
    p.add_argument("--allreduce-max", type=int, help="largest size of the all-reduce sweep, bytes")
    p.add_argument(
        "--allreduce-iterations", type=int, help="timed iterations of each all-reduce row"
    )
    p.add_argument(
        "--allreduce-sets",
        help="gradient sets of the grads row, comma-separated from "
        "resnet50, bert-base, many-small (default: all three)",
    )
    p.add_argument("--json", metavar="PATH", help="write every result as JSON")
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("A.json", "B.json"),
        help="no run: compare two --json files row by row (the ratio B/A of each row's medians, "
        "with both runs' spread); needs no MPI",
    )
    p.add_argument("--csv", metavar="PATH", help="write every result as CSV")
    p.add_argument(
        "--plot", metavar="PATH", help="write a PNG plot (needs matplotlib: mpisync[plot])"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _node_ranks(comm) -> int:
    """How many of ``comm``'s ranks share this rank's node (the limit row's cores there)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.size
    finally:
        node.Free()


def _osu_ops(text: str) -> str:
    """``--osu-ops``: comma-separated names of :data:`osu.OPERATIONS`."""
    unknown = [op for op in text.split(",") if op and op not in _osu.OPERATIONS]
    if unknown or not text.strip(","):
        raise _argparse.ArgumentTypeError(
            f"choose from {', '.join(_osu.OPERATIONS)}, comma-separated; got {text!r}"
        )
    return text


def _osu_sizes(op: str, sizes: list) -> list:
    return [s for s in sizes if s >= _osu.OPERATIONS[op][2]]


def _ints(text: str) -> list:
    return [int(v) for v in text.split(",") if v.strip()]


class _Progress(_progress.Progress):
    """Rank 0's progress: a tqdm bar (``mpisync[bench]``) with its total, else plain-text lines."""

    def __init__(self, comm, total: int, enabled: bool):
        super().__init__("mpisync bench", total, enabled=enabled and comm.rank == 0)

    def step(self, label: str = "") -> None:
        self.update(1, label)


def _strategy_list(comm, defaults) -> list:
    items = list(_strategies.STRATEGIES.items())
    out = []
    for name, factory in items:
        if name == "Ibcast ring":
            name, factory = (
                f"Ibcast ring (cap {defaults['max_concurrent']})",
                _strategies.ibcast_ring(defaults["max_concurrent"]),
            )
        out.append((name, factory))
    return out


def _memory_row(comm, params, root) -> dict:
    # tracemalloc sees Python and numpy allocations made while it runs: a repeated sync's buffers
    # (made before) are added whole; a cold sync's only where they are mappings it cannot see.
    syncer = mpisync.ParamSync(comm, root=root)
    syncer.sync(params)  # set up: its transport's buffers
    repeated = _memory.traced_peak(lambda: syncer.sync(params)) + syncer.buffer_bytes
    syncer.close()
    buffers = []

    def cold_sync():
        with mpisync.ParamSync(comm, root=root) as cold_syncer:
            cold_syncer.sync(params)
            buffers.append(cold_syncer._mapped_bytes)

    cold = _memory.traced_peak(cold_sync) + buffers[0]
    s = _config.resolve()
    peaks = _np.array([repeated, cold, _memory.peak_rss_bytes()], dtype=_np.int64)
    comm.Allreduce(MPI.IN_PLACE, peaks, op=MPI.MAX)
    return {
        "extra_bytes_repeated": int(peaks[0]),
        "extra_bytes_cold": int(peaks[1]),
        "peak_rss_bytes": int(peaks[2]),
        "bound_bytes": s.max_concurrent.value * s.fusion_bytes.value,
    }


def _measure(comm, runs, opt, step) -> dict:
    return measure_interleaved(
        comm, runs, iterations=opt["iterations"], warmup=opt["warmup"], progress=step
    )


def _workload(comm, name, args, opt, strategies, sweeps, progress) -> tuple:
    """One workload's row (strategies side by side, memory) and its sweep rows (``sweeps``: the
    ``(param, value)`` pairs to sweep on it, or none)."""
    # "<workload>-torch": the same shapes as torch CPU tensors, one allocation per tensor (a
    # state_dict)
    torch_set = name.endswith("-torch")
    params = make_params(
        workload(name[:-6] if torch_set else name), comm.rank, "torch" if torch_set else "numpy"
    )
    nbytes = sum(int(a.nbytes) for a in params.values())
    factories = {k: f for k, f in strategies if not torch_set or k in _strategies.TORCH_STRATEGIES}
    factories.update(
        {("sweep", key, value): _strategies.paramsync(**{key: value}) for key, value in sweeps}
    )
    runs: dict = {}
    closers = []
    for label, factory in factories.items():
        runs[label], close = factory(comm, params, args.root)
        closers.append(close)
    runs[LIMIT] = _limits.limit_run(comm, "broadcast", nbytes, args.root)
    try:
        timings = _measure(comm, runs, opt, lambda n=name: progress.step(n))
    finally:
        for close in closers:
            close()
    flat = next(t.median for k, t in timings.items() if isinstance(k, str) and k.startswith("flat"))
    per = next(
        t.median for k, t in timings.items() if isinstance(k, str) and k.startswith("per-tensor")
    )
    limit = timings[LIMIT].median
    channel = {k: getattr(runs[k], "channel", None) for k in timings}  # mpisync's own strategies
    rows = [
        {
            "strategy": k,
            "median_s": t.median,
            **t.spread(),
            "gbps": nbytes / t.median / 1e9,
            "bandwidth_vs_flat": flat / t.median,
            "speedup_vs_per_tensor": per / t.median,
            "of_limit": limit / t.median if comm.size > 1 else None,
            "channel": channel[k],
        }
        for k, t in timings.items()
        if isinstance(k, str)
    ]
    swept = [
        {
            "workload": name,
            "param": k[1],
            "value": k[2],
            "median_s": t.median,
            **t.spread(),
            "gbps": nbytes / t.median / 1e9,
            "bandwidth_vs_flat": flat / t.median,
            "of_limit": limit / t.median if comm.size > 1 else None,
            "channel": channel[k],
        }
        for k, t in timings.items()
        if not isinstance(k, str)
    ]
    memory = _memory_row(comm, params, args.root)
    progress.step(f"{name}: memory")
    row = {
        "workload": name,
        "tensors": len(params),
        "bytes": nbytes,
        "limit_bytes_per_rank": _limits.work("broadcast", nbytes, comm.size).copy,
        "results": rows,
    }
    return {**row, "memory": memory}, swept


def run(comm, args) -> dict:
    """Run the suite with parsed ``args``; every rank returns the same results dict.

    Progress (rank 0): one step per OSU size, per timed iteration of each workload and per memory
    row; the all-reduce rows report their own progress."""
    base = QUICK if args.quick else FULL
    opt = {
        k: getattr(args, k) if getattr(args, k, None) is not None else v for k, v in base.items()
    }
    names = [w for w in opt["workloads"].split(",") if w]
    sweep_names = (
        [] if args.no_sweep else [w for w in args.sweep_workloads.split(",") if w in names]
    )
    defaults = _config.resolve().values()
    strategies = _strategy_list(comm, defaults)
    concurrency, fusion = _ints(opt["sweep_concurrency"]), _ints(opt["sweep_fusion"])
    osu_sizes = [] if args.no_osu else _osu.sizes_up_to(opt["osu_max"])
    osu_ops = [op for op in opt["osu_ops"].split(",") if op] if osu_sizes else []
    sweeps = [
        (key, value)
        for key, values in (("max_concurrent", concurrency), ("fusion_bytes", fusion))
        for value in values
    ]
    total = sum(len(_osu_sizes(op, osu_sizes)) for op in osu_ops)
    total += len(names) * (opt["iterations"] + 1)
    progress = _Progress(comm, total, not args.no_progress)
    results: dict[str, Any] = {
        "meta": {
            "mpisync": mpisync.__version__,
            "ranks": comm.size,
            "root": args.root,
            "quick": bool(args.quick),
            "mpi_library": _mpilib.library_name(MPI.Get_library_version()),
            "date": _datetime.datetime.now(_datetime.timezone.utc).isoformat(timespec="seconds"),
            "iterations": opt["iterations"],
            "warmup": opt["warmup"],
            "defaults": defaults,
            "osu_method": _osu.method(),
            "thread_level": _mpilib.thread_level(),
            "node_ranks": _node_ranks(comm),
            "environment": _environment.describe(comm),
        },
        "osu": {},
        "workloads": [],
        "sweeps": [],
    }
    for op in osu_ops:
        step = lambda o=op: progress.step(f"osu {o}")  # noqa: E731
        kwargs = {"scale": opt["osu_scale"], "root": args.root, "progress": step}
        if op == "bcast":
            results["osu"][op] = _osu.bcast_sweep(
                comm, osu_sizes, overlap=not args.no_ibcast, **kwargs
            )
        else:
            results["osu"][op] = _osu.sweep(comm, op, osu_sizes, **kwargs)
    for name in names:
        row, swept = _workload(
            comm, name, args, opt, strategies, sweeps if name in sweep_names else [], progress
        )
        results["workloads"].append(row)
        results["sweeps"] += swept
    progress.close()  # the all-reduce rows have their own progress
    if args.allreduce:
        results["allreduce"] = _allreduce_rows(comm, args.allreduce, opt, args.no_progress)
    return results


def _allreduce_rows(comm, rows: str, opt: dict, no_progress: bool) -> dict:
    from . import allreduce as _allreduce

    row_names = [r for r in rows.split(",") if r]
    argv = [
        "--rows",
        *row_names,
        "--max-bytes",
        str(opt["allreduce_max"]),
        "--iterations",
        str(opt["allreduce_iterations"]),
    ]
    if no_progress:
        argv.append("--no-progress")
    if opt["allreduce_sets"]:
        argv += ["--sets", *opt["allreduce_sets"].split(",")]
    options = _allreduce.parser().parse_args(argv)
    return _allreduce.run(comm, options)


def main(args=None, comm=None) -> int:
    """Entry point of ``mpisync bench``: run, print the table on rank 0, write the requested
    files."""
    parsed = parser().parse_args(args)
    comm = MPI.COMM_WORLD if comm is None else comm
    results = run(comm, parsed)
    if comm.rank == 0:
        print(_output.table(results))
        if parsed.json:
            _output.write_json(results, parsed.json)
        if parsed.csv:
            _output.write_csv(results, parsed.csv)
        if parsed.plot:
            _output.write_plot(results, parsed.plot)
    return 0
