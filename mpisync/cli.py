"""The ``mpisync`` command: ``info`` and ``bench``."""

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


def _parser() -> _argparse.ArgumentParser:
    parser = _argparse.ArgumentParser(prog="mpisync", description="Keep model parameters identical across MPI ranks.")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="MPI library, thread level, effective defaults and their source")
    info.add_argument("--json", action="store_true", help="print JSON instead of a table")
    info.set_defaults(func=_info)
    bench = sub.add_parser("bench", add_help=False, help="the microbenchmark suite (run under mpiexec)")
    bench.set_defaults(func=_bench)
    return parser


def main(args=None) -> int:
    """Run the command line with ``args`` (default: ``sys.argv[1:]``); return the exit status."""
    argv = list(_sys.argv[1:] if args is None else args)
    parsed, rest = _parser().parse_known_args(argv)
    if parsed.command == "bench":  # the bench has its own parser (``mpisync bench --help``)
        return parsed.func(parsed, rest)
    if rest:
        _parser().error(f"unrecognized arguments: {' '.join(rest)}")
    return parsed.func(parsed)
