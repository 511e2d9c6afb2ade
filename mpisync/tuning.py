"""``mpisync tune``: measure the host transports here and write a tuning file the rule then defers to.

The file names the machine (host name, processor, CPU count), the MPI library
and the rank layout it was measured on; a file written for anything else is
ignored (the built-in rule of :mod:`mpisync.selection` applies). Its entries
give a channel for sets of small tensors (every one smaller than
``fusion_bytes``) and for the rest. Location: ``MPISYNC_TUNING`` when set, else
``$XDG_CACHE_HOME/mpisync/tuning.json`` (``~/.cache/mpisync/tuning.json``).
Every rank reads it, and an entry counts only when every rank read the same.
"""

from __future__ import annotations

import argparse as _argparse
import array as _array
import json as _json
import os as _os
import platform as _platform
import stat as _stat
import statistics as _statistics
import time as _time

__all__ = ["tuning_path", "identity", "load", "lookup", "main", "FORMAT"]

FORMAT = 1
_CLASSES = ("small", "large")
_cache: dict = {}  # path -> (mtime_ns, size, parsed file or None)


def tuning_path() -> str:
    """Where the tuning file is read and written (``MPISYNC_TUNING`` overrides)."""
    explicit = _os.environ.get("MPISYNC_TUNING", "").strip()
    if explicit:
        return explicit
    base = _os.environ.get("XDG_CACHE_HOME", "").strip() or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "mpisync", "tuning.json")


def _machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{_platform.node()}|{cpu or _platform.processor()}|{_os.cpu_count()}"


def identity(layout: str) -> dict:
    """What a tuning file must match: the machine and MPI library it is read on, and ``layout``
    (``"2x1"``: 2 ranks, one node)."""
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()
    return {"machine": _machine(), "mpi": library[0].strip() if library else "unknown", "layout": layout}


def load(path: str | None = None):
    """The parsed tuning file, or None (missing, unreadable, malformed, another format)."""
    path = path or tuning_path()
    try:
        stat = _os.stat(path)
    except OSError:
        return None
    if not _stat.S_ISREG(stat.st_mode):  # a FIFO would block open(), a directory fail it
        return None
    cached = _cache.get(path)
    if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
        return cached[2]
    try:
        with open(path, encoding="utf-8") as f:
            doc = _json.load(f)
        ok = (isinstance(doc, dict) and doc.get("format") == FORMAT and isinstance(doc.get("identity"), dict)
              and isinstance(doc.get("entries"), dict))
    except Exception:  # any unreadable file (deep nesting: RecursionError) is "no tuning file" on this rank
        doc, ok = None, False
    _cache[path] = (stat.st_mtime_ns, stat.st_size, doc if ok else None)
    return doc if ok else None


def lookup(layout: str) -> tuple:
    """``(entries, why)``: the file's ``{"small": channel, "large": channel}`` when it was written for
    the machine and MPI library it is read on and for ``layout``, else ``({}, why not)``."""
    doc = load()
    if doc is None:
        return {}, f"no tuning file at {tuning_path()}"
    mine = identity(layout)
    for key, value in mine.items():
        if doc["identity"].get(key) != value:
            return {}, f"tuning file {tuning_path()} is for another {key} ({doc['identity'].get(key)!r})"
    entries = {k: v for k, v in doc["entries"].items() if k in _CLASSES and isinstance(v, str)}
    return entries, f"tuning file {tuning_path()}"


def tuned_words(layout: str) -> tuple:
    """This rank's tuned channels as words for the facts all-reduce: an index into
    :data:`mpisync.selection.CHANNELS` per class, -1 where none."""
    from .selection import CHANNELS

    try:
        entries, _ = lookup(layout)
    except Exception:  # raised here, before the facts all-reduce, it would leave the other ranks waiting
        entries = {}
    return tuple(CHANNELS.index(entries[c]) if entries.get(c) in CHANNELS else -1 for c in _CLASSES)


def _measure(comm, params, channel: str, rounds: int, first: bool) -> float:
    """The slowest rank's median seconds of a sync through ``channel`` (a new syncer per sync if ``first``)."""
    from mpi4py import MPI

    from .sync import ParamSync

    times = []
    syncer = None
    for _ in range(rounds + (0 if first else 2)):
        if syncer is None or first:
            if syncer is not None:
                syncer.close()
            syncer = ParamSync(comm)
            syncer._prefer(channel)
        comm.Barrier()
        start = _time.perf_counter()
        syncer.sync(params)
        elapsed = _array.array("d", [_time.perf_counter() - start])
        comm.Allreduce(MPI.IN_PLACE, elapsed, op=MPI.MAX)  # a buffer call: nothing from peers is unpickled
        times.append(elapsed[0])
    syncer.close()
    return _statistics.median(times if first else times[2:])


def main(comm, args=None) -> int:
    """Measure each host transport on two parameter sets (small tensors, large ones), first sync and
    repeated, and write the tuning file on rank 0 (the path is printed)."""
    from .selection import CHANNELS, gather_facts
    from .clock import Deadline
    from .workloads import make_params, many_small, resnet50

    parser = _argparse.ArgumentParser(prog="mpisync tune")
    parser.add_argument("--rounds", type=int, default=5, help="syncs timed per transport and set")
    parser.add_argument("--output", help="where to write (default: the tuning file's location)")
    opt = parser.parse_args(args)
    dup = comm.Dup()
    try:
        facts = gather_facts(dup, Deadline(None).wait)
        sets = {"small": make_params(many_small(), comm.rank), "large": make_params(resnet50(), comm.rank)}
        entries, measured = {}, {}
        for cls, params in sets.items():
            scores = {}
            for channel in CHANNELS:
                first = _measure(dup, params, channel, opt.rounds, True)
                steady = _measure(dup, params, channel, opt.rounds, False)
                # A job syncs a handful of times: the first sync counts as much as four repeated ones.
                scores[channel] = first + 4 * steady
                measured[f"{cls}/{channel}"] = {"first_ms": round(first * 1e3, 3), "repeated_ms": round(steady * 1e3, 3)}
            entries[cls] = min(scores, key=scores.__getitem__)
        if comm.rank == 0:
            path = opt.output or tuning_path()
            doc = {"format": FORMAT, "identity": identity(facts.layout()), "entries": entries, "measured": measured,
                   "written": _time.strftime("%Y-%m-%dT%H:%M:%SZ", _time.gmtime())}
            _os.makedirs(_os.path.dirname(_os.path.abspath(path)), exist_ok=True)
            temporary = f"{path}.{_os.getpid()}.tmp"
            with open(temporary, "w", encoding="utf-8") as f:
                _json.dump(doc, f, indent=2)
            _os.replace(temporary, path)
            print(f"mpisync tune: wrote {path}: {_json.dumps(entries)}")
            for key, row in measured.items():
                print(f"  {key:28s} first {row['first_ms']:9.3f} ms   repeated {row['repeated_ms']:9.3f} ms")
    finally:
        dup.Free()
    return 0


def describe(size: int, one_node: bool) -> str:
    """For ``mpisync info``: which rule or tuning entry applies to a job of ``size`` ranks."""
    layout = f"{size}x1" if one_node else f"{size}-ranks-multinode"
    entries, why = lookup(layout)
    if entries:
        return f"{why}: {entries} (layout {layout})"
    return (f"built-in rule ({why}): one node -> shared memory for sets of small tensors, cross-memory "
            "copies for the rest; several nodes -> MPI")
