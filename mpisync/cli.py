"""The ``mpisync`` command: ``info``, ``stage-checkpoint``, ``bench`` and ``tune``."""

from __future__ import annotations

import argparse as _argparse
import json as _json
import sys as _sys

__all__ = ["main"]


def _info(args) -> int:
    from .info import collect_info

    info = collect_info()
    if args.json:
        print(_json.dumps(info, indent=2))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "defaults":
            print("defaults:")
            for name, d in value.items():
                print(f"  {name:<15} = {d['value']!s:<10} ({d['source']}; set with {d['env']})")
        else:
            print(f"{key:<{width}} : {value}")
    return 0


def _bench(args, rest) -> int:
    from .bench import main as bench_main

    return bench_main(rest)


def _tune(args, rest) -> int:
    from mpi4py import MPI

    from .tuning import main as tune_main

    return tune_main(MPI.COMM_WORLD, rest)


def _stage(args) -> int:
    from mpi4py import MPI

    from .errors import SyncError
    from .staging import stage_checkpoint

    comm = MPI.COMM_WORLD
    bar = None
    if comm.rank == args.root and not args.no_progress:
        try:
            from tqdm import tqdm

            bar = tqdm(unit="B", unit_scale=True, desc="stage-checkpoint", file=_sys.stderr, leave=False)
        except ImportError:
            pass
    try:
        report = stage_checkpoint(args.src, args.to, comm, root=args.root, chunk_bytes=args.chunk_mb << 20,
                                  max_concurrent=args.max_concurrent, timeout=args.timeout,
                                  per_rank=args.per_rank, progress=bar.update if bar is not None else None)
    except SyncError as exc:
        if comm.rank == 0:
            print(f"mpisync stage-checkpoint: error: {exc}", file=_sys.stderr, flush=True)
        return 1
    finally:
        if bar is not None:
            bar.close()
    if comm.rank == args.root:
        print(f"mpisync stage-checkpoint: {args.src} -> {args.to}: {report.bytes} bytes to {report.writers} "
              f"writer(s) in {report.seconds:.3f} s ({report.gbps:.2f} GB/s), blake2b {report.digest} verified",
              flush=True)
    return 0


def _parser() -> _argparse.ArgumentParser:
    parser = _argparse.ArgumentParser(prog="mpisync", description="Keep model parameters identical across MPI ranks.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="MPI library, thread level, effective defaults and their source")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_info)
    stage = sub.add_parser("stage-checkpoint", help="copy a .safetensors/.npz checkpoint from root to every node")
    stage.add_argument("src", help="the checkpoint, read on root only")
    stage.add_argument("--to", required=True, help="destination on each node; may hold {rank}, {node}, {host}")
    stage.add_argument("--root", type=int, default=0)
    stage.add_argument("--chunk-mb", type=int, default=64, help="chunk size in MiB (memory: chunk x max-concurrent)")
    stage.add_argument("--max-concurrent", type=int, default=4)
    stage.add_argument("--timeout", type=float, help="seconds per collective (default: MPISYNC_TIMEOUT or 300)")
    stage.add_argument("--per-rank", action="store_true", help="every rank writes (default: one writer per node)")
    stage.add_argument("--no-progress", action="store_true")
    stage.set_defaults(func=_stage)
    bench = sub.add_parser("bench", add_help=False, help="the microbenchmark suite (run under mpiexec)")
    bench.set_defaults(func=_bench)
    tune = sub.add_parser("tune", add_help=False, help="measure the transports here, write a tuning file (under mpiexec)")
    tune.set_defaults(func=_tune)
    return parser


def main(args=None) -> int:
    """Run the command line with ``args`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = list(_sys.argv[1:] if args is None else args)
    parsed, rest = _parser().parse_known_args(argv)
    if parsed.command in ("bench", "tune"):  # each has its own parser (``mpisync bench --help``)
        return parsed.func(parsed, rest)
    if rest:
        _parser().error(f"unrecognized arguments: {' '.join(rest)}")
    return parsed.func(parsed)
