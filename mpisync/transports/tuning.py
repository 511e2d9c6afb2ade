"""``mpisync tune``: measure the host transports here and write a tuning file the rule then defers
to.

The file names the machine (host name, processor, CPU count), the MPI library
and the rank layout it was measured on; a file written for anything else is
ignored (the built-in rule of :mod:`mpisync.transports.selection` applies). Its entries
give a channel for sets of small tensors (every one smaller than
``fusion_bytes``) and for the rest. Location: ``MPISYNC_TUNING`` when set, else
``$XDG_CACHE_HOME/mpisync/tuning.json`` (``~/.cache/mpisync/tuning.json``).
Every rank reads it, and an entry counts only when every rank read the same.
"""

from __future__ import annotations

import json as _json
import os as _os
import platform as _platform
import stat as _stat

__all__ = ["tuning_path", "identity", "load", "lookup", "describe", "FORMAT", "CLASSES"]

FORMAT = 1
#: The largest tuning file read (one written by ``mpisync tune`` is about 1 KiB).
_FILE_LIMIT = 1 << 20
#: The set classes a tuning file has an entry for: all tensors under ``fusion_bytes``, or not.
CLASSES = ("small", "large")
_cache: dict = {}  # path -> (mtime_ns, size, parsed file or None)


def tuning_path() -> str:
    """Where the tuning file is read and written (``MPISYNC_TUNING`` overrides)."""
    explicit = _os.environ.get("MPISYNC_TUNING", "").strip()
    if explicit:
        return explicit
    base = _os.environ.get("XDG_CACHE_HOME", "").strip() or _os.path.join(
        _os.path.expanduser("~"), ".cache"
    )
    return _os.path.join(base, "mpisync", "tuning.json")


def _machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), ""
            )
    except OSError:
        pass
    return f"{_platform.node()}|{cpu or _platform.processor()}|{_os.cpu_count()}"


def identity(layout: str) -> dict:
    """What a tuning file must match: the machine and MPI library it is read on, and ``layout``
    (``"2x1"``: 2 ranks, one node)."""
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()
    return {
        "machine": _machine(),
        "mpi": library[0].strip() if library else "unknown",
        "layout": layout,
    }


def load(path: str | None = None):
    """The parsed tuning file, or None (missing, unreadable, malformed, another format)."""
    path = path or tuning_path()
    try:
        stat = _os.stat(path)
    except OSError:
        return None
    if not _stat.S_ISREG(stat.st_mode):  # a FIFO would block open(), a directory fail it
        return None
    if stat.st_size > _FILE_LIMIT:  # every rank reads it at start-up: never a large file
        return None
    cached = _cache.get(path)
    if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
        return cached[2]
    try:
        with open(path, encoding="utf-8") as f:
            doc = _json.load(f)
        ok = (
            isinstance(doc, dict)
            and doc.get("format") == FORMAT
            and isinstance(doc.get("identity"), dict)
            and isinstance(doc.get("entries"), dict)
        )
    # any unreadable file (deep nesting: RecursionError) is "no tuning file" on this rank
    except Exception:
        doc, ok = None, False
    _cache[path] = (stat.st_mtime_ns, stat.st_size, doc if ok else None)
    return doc if ok else None


def lookup(layout: str) -> tuple:
    """``(entries, why)``: the file's ``{"small": channel, "large": channel}`` when it was written
    for
    the machine and MPI library it is read on and for ``layout``, else ``({}, why not)``."""
    doc = load()
    if doc is None:
        return {}, f"no tuning file at {tuning_path()}"
    mine = identity(layout)
    for key, value in mine.items():
        if doc["identity"].get(key) != value:
            return (
                {},
                f"tuning file {tuning_path()} is for another {key} ({doc['identity'].get(key)!r})",
            )
    entries = {k: v for k, v in doc["entries"].items() if k in CLASSES and isinstance(v, str)}
    return entries, f"tuning file {tuning_path()}"


def describe(size: int, one_node: bool) -> str:
    """For ``mpisync info``: which rule or tuning entry applies to a job of ``size`` ranks."""
    layout = f"{size}x1" if one_node else f"{size}-ranks-multinode"
    entries, why = lookup(layout)
    if entries:
        return f"{why}: {entries} (layout {layout})"
    return (
        f"built-in rule ({why}): one node -> MPI for sets of small tensors, cross-memory "
        "copies for the rest; several nodes -> MPI"
    )
