"""The ``mpisync`` command: ``info``, ``stage-checkpoint``, ``bench``, ``tune``, ``timeline``,
``docs`` and ``--version``.

Options are checked before any work: a missing optional package (matplotlib
for ``--plot`` and ``timeline``), a folder that does not exist for an output
file, a bad number, each ends the command at once with status 2 and one line
saying what to do. Under ``mpiexec`` only rank 0 prints tables and messages.

Without an MPI library, ``--version``, ``--help``, ``info`` (which then says in one line what to
install, and exits with status 1), ``docs`` and ``timeline`` still run; the other commands print
that line and exit with status 1.
"""

from __future__ import annotations

import argparse as _argparse
import importlib as _importlib
import json as _json
import os as _os
import sys as _sys
from collections.abc import Sequence

from .._runtime import mpilib as _mpilib
from .outputs import prepare_output

__all__ = ["main"]

_PLOT_HINT = "needs matplotlib: pip install 'mpisync[plot]' (or matplotlib itself)"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``"1 tensor"``, ``"2 tensors"``."""
    return f"{count} {word if count == 1 else many or word + 's'}"


_NEEDS_NO_MPI = ("info", "timeline", "docs")

#: Where the manual is published: setup.cfg's ``project_urls`` Documentation entry, which an
#: installed package's metadata carries; this copy serves a checkout installed before it had one.
DOCS_URL = "https://github.com/mpisync/mpisync/tree/main/docs"


def _world():
    """``(rank, size)`` of ``MPI.COMM_WORLD`` (MPI starts here: a singleton without a launcher);
    ``(0, 1)`` without an MPI library."""
    if _mpilib.PROBLEM is not None:
        return 0, 1
    from mpi4py import MPI

    return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def _usage_error(command: str, message: str) -> int:
    """Print ``message`` once (rank 0) and return the usage-error status, 2."""
    if _world()[0] == 0:
        print(f"mpisync {command}: error: {message}", file=_sys.stderr, flush=True)
    return 2


def _agreed_usage_error(command: str, problem: str) -> int:
    """Exit status 2 on every rank if any rank found ``problem`` (the lowest such rank prints it),
    else 0.

    The checks read per-rank facts (an importable module, a folder on this node): a rank
    that stopped alone would leave the others waiting in the command's first collective.
    """
    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    if world.size == 1:
        return _usage_error(command, problem) if problem else 0
    first = np.array([world.rank if problem else world.size], dtype=np.int64)
    world.Allreduce(MPI.IN_PLACE, first, op=MPI.MIN)
    if first[0] == world.size:
        return 0
    if world.rank == first[0]:
        where = f" (on rank {world.rank})" if world.rank else ""
        print(f"mpisync {command}: error: {problem}{where}", file=_sys.stderr, flush=True)
    return 2


def _importable(module: str) -> bool:
    try:
        _importlib.import_module(module)
        return True
    except ImportError:
        return False


def _info(args) -> int:
    from .info import collect_info

    info = collect_info()
    status = 0 if _mpilib.PROBLEM is None else 1  # mpi_library then says what to install
    if _world()[0] != 0:  # under mpiexec every rank collects, one prints
        return 0
    if args.json:
        print(_json.dumps(info, indent=2))
        return status
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, list):  # setting_errors, unknown_settings, gpus
            value = "; ".join(map(str, value)) or "none"
        if key == "settings":
            print("settings:")
            for env, d in value.items():
                shown = "unset" if d["value"] is None else d["value"]
                bad = f"; {d['invalid']!r} is not a switch" if "invalid" in d else ""
                print(f"  {env:<25} = {shown!s:<10} ({d['source']}{bad})")
            continue
        if key != "defaults":
            print(f"{key:<{width}} : {value}")
            continue
        print("defaults:")
        for name, d in value.items():
            if "error" in d:
                why = d["error"].removeprefix(f"{d['env']}: ")
                print(
                    f"  {name:<15} = INVALID    ({d['env']}={d['raw']!r}: {why}; every sync raises "
                    f"until it is fixed or unset)"
                )
            else:
                print(f"  {name:<15} = {d['value']!s:<10} ({d['source']}; set with {d['env']})")
    return status


def _bench_problem(rest: list) -> tuple:
    """``(parsed options, problem or "")``: what would make the bench fail after its work."""
    from .bench.suite import parser as bench_parser
    from .workloads import WORKLOADS

    # exits 2 with its usage on a bad option, before any work
    opts = bench_parser().parse_args(rest)
    from .. import config as _config
    from ..errors import InvalidParamError

    try:
        _config.resolve()
    except InvalidParamError as exc:  # a bad MPISYNC_* setting: every measured sync would raise it
        return opts, f"{exc} (see `mpisync info`)"
    if opts.plot and not _importable("matplotlib"):
        return opts, f"--plot {_PLOT_HINT}"
    if _world()[0] == 0:  # rank 0 writes the files
        for path, option in ((opts.json, "--json"), (opts.csv, "--csv"), (opts.plot, "--plot")):
            if prepare_output(path, option):
                return opts, prepare_output(path, option)
    for flag, value in (("--osu-scale", opts.osu_scale), ("--osu-max", opts.osu_max)):
        if value is not None and not value > 0:  # NaN too
            return opts, f"{flag} must be > 0, got {value}"
    names = [w for w in (opts.workloads or "").split(",") if w]
    unknown = [w for w in names if w.removesuffix("-torch") not in WORKLOADS]
    if unknown:
        return opts, (
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)} "
            f"(each also as NAME-torch: torch CPU tensors, one allocation per tensor)"
        )
    if any(w.endswith("-torch") for w in names) and not _importable("torch"):
        return opts, "a NAME-torch workload needs torch: pip install 'mpisync[torch]'"
    problem = _allreduce_problem(opts.allreduce, opts.allreduce_sets)
    if problem:
        return opts, problem
    for flag, text in (
        ("--sweep-concurrency", opts.sweep_concurrency),
        ("--sweep-fusion", opts.sweep_fusion),
    ):
        try:
            [int(v) for v in (text or "").split(",") if v.strip()]
        except ValueError:
            return opts, f"{flag} takes comma-separated integers, got {text!r}"
    for flag, value in (("--iterations", opts.iterations), ("--warmup", opts.warmup)):
        if value is not None and value < (1 if flag == "--iterations" else 0):
            return opts, f"{flag} must be >= {1 if flag == '--iterations' else 0}, got {value}"
    size = _world()[1]
    if not 0 <= opts.root < size:
        return opts, f"--root {opts.root} is not a rank of this job ({plural(size, 'rank')})"
    return opts, ""


def _allreduce_problem(rows, sets) -> str:
    from .bench.allreduce import GRAD_SETS
    from .bench.suite import ALLREDUCE_ROWS

    asked = [r for r in (rows or "").split(",") if r]
    unknown = [r for r in asked if r not in ALLREDUCE_ROWS]
    if unknown:
        return (
            f"--allreduce: unknown row(s) {', '.join(unknown)}; choose from "
            f"{', '.join(ALLREDUCE_ROWS)}"
        )
    if rows is not None and not asked:
        return (
            f"--allreduce takes comma-separated rows from {', '.join(ALLREDUCE_ROWS)}, got {rows!r}"
        )
    unknown = [s for s in (sets or "").split(",") if s and s not in GRAD_SETS]
    if unknown:
        return (
            f"--allreduce-sets: unknown set(s) {', '.join(unknown)}; choose from "
            f"{', '.join(GRAD_SETS)}"
        )
    if {"sweep", "ddp", "collectives", "check"} & set(asked) and not _importable("torch"):
        return (
            "--allreduce sweep, ddp, collectives and check compare the torch backend with gloo: "
            "pip install 'mpisync[torch]'"
        )
    return ""


def _compare(rest: list) -> int:
    """``mpisync bench --compare A.json B.json``: no MPI, no run; exit 2 on a bad file."""
    from .bench import compare

    paths = rest[rest.index("--compare") + 1 :]
    if len(paths) != 2 or len(rest) != 3:
        print("mpisync bench: --compare takes two JSON files and nothing else", file=_sys.stderr)
        return 2
    try:
        return compare.main(paths)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"mpisync bench: --compare: {exc.__class__.__name__}: {exc} (files written by "
            "`mpisync bench --json` are expected)",
            file=_sys.stderr,
        )
        return 2


def _bench(args, rest) -> int:
    if "--compare" in rest:
        return _compare(rest)
    opts, problem = _bench_problem(rest)
    if _agreed_usage_error("bench", problem):
        return 2
    from .bench import main as bench_main

    rank, size = _world()
    if size == 1 and rank == 0:
        print(
            "mpisync bench: 1 rank (no launcher, or mpiexec -n 1): no peer to broadcast to, so it "
            "measures "
            "mpisync's own cost on one process; run `mpiexec -n 2 mpisync bench` or more ranks for "
            "broadcasts",
            file=_sys.stderr,
            flush=True,
        )
    return bench_main(rest)


def _tune(args, rest) -> int:
    from mpi4py import MPI

    from . import tune

    opt = tune.parser().parse_args(rest)
    # every rank checks, and stops with status 2 at once when any rank found a problem
    if _agreed_usage_error("tune", tune.problem(opt, _world()[0])):
        return 2
    return tune.run(MPI.COMM_WORLD, opt)


def _stage_problem(args) -> str:
    if args.chunk_mb < 1:
        return f"--chunk-mb must be >= 1, got {args.chunk_mb}"
    if args.max_concurrent < 1:
        return f"--max-concurrent must be >= 1, got {args.max_concurrent}"
    if args.timeout is not None and not args.timeout >= 0:
        return f"--timeout must be >= 0 seconds, got {args.timeout}"
    rank, size = _world()
    if not 0 <= args.root < size:
        return f"--root {args.root} is not a rank of this job ({plural(size, 'rank')})"
    return ""


def _stage(args) -> int:
    if _agreed_usage_error("stage-checkpoint", _stage_problem(args)):
        return 2
    from mpi4py import MPI

    from ..errors import SyncError
    from .progressbar import Progress
    from .stage_checkpoint import stage_checkpoint

    comm = MPI.COMM_WORLD
    bar, ok = None, False
    if comm.rank == args.root and not args.no_progress:
        try:
            total = _os.path.getsize(args.src)
        except OSError:
            total = 0  # no bar: the staging reports the missing file on every rank
        bar = Progress("stage-checkpoint", total, unit="B") if total > 0 else None
    try:
        report = stage_checkpoint(
            args.src,
            args.to,
            comm,
            root=args.root,
            chunk_bytes=args.chunk_mb << 20,
            max_concurrent=args.max_concurrent,
            timeout=args.timeout,
            per_rank=args.per_rank,
            progress=bar.update if bar is not None else None,
        )
        ok = True
    except SyncError as exc:  # the same error on every rank: each exits 1, rank 0 says why
        if bar is not None:  # first: the message must not share a line with the bar
            bar.close(ok=False)
            bar = None
        if comm.rank == 0:
            why = str(exc).removeprefix("mpisync: ")
            print(f"mpisync stage-checkpoint: error: {why}", file=_sys.stderr, flush=True)
        return 1
    finally:
        if bar is not None:
            bar.close(ok)
    if comm.rank == args.root:
        print(
            f"mpisync stage-checkpoint: {args.src} -> {args.to}: {plural(report.bytes, 'byte')} to "
            f"{plural(report.writers, 'writer')} in {report.seconds:.3f} s ({report.gbps:.2f} "
            "GB/s), "
            f"blake2b {report.digest} verified",
            flush=True,
        )
    return 0


def _timeline(args) -> int:
    missing = [p for p in args.files if not _os.path.isfile(p)]
    if missing:
        return _usage_error("timeline", f"no such file: {', '.join(missing)}")
    if prepare_output(args.out, "--out"):
        return _usage_error("timeline", prepare_output(args.out, "--out"))
    if not _importable("matplotlib"):
        print(
            f"mpisync timeline: error: drawing {_PLOT_HINT}; the trace files themselves open in "
            "chrome://tracing or https://ui.perfetto.dev",
            file=_sys.stderr,
        )
        return 2
    from .timeline import render

    try:
        spans = render(args.files, args.out, args.sync)
    except (OSError, ValueError) as exc:
        print(f"mpisync timeline: error: {exc}", file=_sys.stderr)
        return 1
    print(
        f"mpisync timeline: {plural(spans, 'span')} from {plural(len(args.files), 'file')} -> "
        f"{args.out}"
    )
    return 0


def docs_url() -> str:
    """The manual's address: the installed package's ``Documentation`` URL, else
    :data:`DOCS_URL`."""
    from importlib import metadata

    try:
        entries = metadata.metadata("mpisync").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        entries = []
    for entry in entries:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "documentation" and url.strip():
            return url.strip()
    return DOCS_URL


def docs_folder() -> str | None:
    """The docs/ folder of the source checkout this mpisync runs from, or ``None`` (installed)."""
    root = _os.path.dirname(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
    folder = _os.path.join(root, "docs")
    if _os.path.isfile(_os.path.join(folder, "index.md")) and _os.path.isfile(
        _os.path.join(root, "setup.cfg")
    ):
        return folder
    return None


def _docs(args) -> int:
    print(f"documentation: {docs_url()}")
    folder = docs_folder()
    if folder is not None:
        print(f"this checkout's copy: {folder} (start at index.md)")
    return 0


def _version() -> str:
    from .. import __version__

    return f"mpisync {__version__}"


def _parser() -> _argparse.ArgumentParser:
    parser = _argparse.ArgumentParser(
        prog="mpisync",
        description="Keep model parameters identical across MPI ranks.",
        epilog=f"Documentation: {docs_url()} (`mpisync docs` prints where it is).",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser(
        "info", help="MPI library, thread level, effective defaults and their source"
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_info)
    stage = sub.add_parser(
        "stage-checkpoint", help="copy a checkpoint file from root to every node"
    )
    stage.add_argument("src", help="the checkpoint (any file; read on root only)")
    stage.add_argument(
        "--to",
        required=True,
        help="destination on each writer; may hold {rank}, {node} "
        "(node index, 0 for rank 0's node), {host}",
    )
    stage.add_argument("--root", type=int, default=0)
    stage.add_argument(
        "--chunk-mb",
        type=int,
        default=64,
        help="chunk size in MiB (memory: chunk x max-concurrent)",
    )
    stage.add_argument("--max-concurrent", type=int, default=4)
    stage.add_argument(
        "--timeout", type=float, help="seconds per collective (default: MPISYNC_TIMEOUT or 300)"
    )
    stage.add_argument(
        "--per-rank", action="store_true", help="every rank writes (default: one writer per node)"
    )
    stage.add_argument("--no-progress", action="store_true")
    stage.set_defaults(func=_stage)
    bench = sub.add_parser(
        "bench", add_help=False, help="the microbenchmark suite (run under mpiexec)"
    )
    bench.set_defaults(func=_bench)
    tune = sub.add_parser(
        "tune",
        add_help=False,
        help="measure the transports here, write a tuning file (under mpiexec)",
    )
    tune.set_defaults(func=_tune)
    timeline = sub.add_parser(
        "timeline", help="draw MPISYNC_TIMELINE trace files as a PNG (needs mpisync[plot])"
    )
    timeline.add_argument("files", nargs="+", help="one Chrome-trace JSON per rank")
    timeline.add_argument("--out", required=True, help="the PNG to write")
    timeline.add_argument("--sync", type=int, default=0, help="only the N-th sync (from 1); 0: all")
    timeline.set_defaults(func=_timeline)
    docs = sub.add_parser("docs", help="print where the documentation is")
    docs.set_defaults(func=_docs)
    return parser


def main(args: Sequence[str] | None = None) -> int:
    """Run the command line with ``args`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = list(_sys.argv[1:] if args is None else args)
    parsed, rest = _parser().parse_known_args(argv)
    if _mpilib.PROBLEM is not None and parsed.command not in _NEEDS_NO_MPI:
        print(f"mpisync {parsed.command}: error: {_mpilib.PROBLEM}", file=_sys.stderr)
        return 1
    if parsed.command in ("bench", "tune"):  # each has its own parser (``mpisync bench --help``)
        return parsed.func(parsed, rest)
    if rest:
        _parser().error(f"unrecognized arguments: {' '.join(rest)}")
    return parsed.func(parsed)
