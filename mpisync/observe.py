"""Logging (``logging.getLogger("mpisync")``) and the Chrome-trace timeline of each rank.

``MPISYNC_LOG=debug`` (or ``info``) attaches a stderr handler that prefixes the
rank, unless the application configured the ``mpisync`` logger itself.
``MPISYNC_TIMELINE=PATH`` writes one Chrome-trace JSON per rank (``PATH`` with
``{rank}`` replaced, else ``PATH.rank<N>.json``), viewable in chrome://tracing
or Perfetto: phases validate, pack, broadcast, unpack, fan-out, verify. A
``ParamSync`` reads it at its first sync.
"""

from __future__ import annotations

import json as _json
import logging as _logging
import os as _os
import threading as _threading
import time as _time

__all__ = ["logger", "configure_logging", "Timeline", "timeline_for", "timeline_path"]

logger = _logging.getLogger("mpisync")
_configured = False
_MAX_EVENTS = 200_000


def configure_logging(rank: int) -> None:
    """Honour ``MPISYNC_LOG`` once per process (no-op if unset or already configured)."""
    global _configured
    if _configured:
        return
    _configured = True
    level = _os.environ.get("MPISYNC_LOG", "").strip().upper()
    if not level or logger.handlers:
        return
    handler = _logging.StreamHandler()
    handler.setFormatter(_logging.Formatter(f"mpisync[rank {rank}] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(getattr(_logging, level, _logging.INFO))
    logger.propagate = False


def timeline_path(rank: int) -> str | None:
    """Where this rank's timeline goes, from ``MPISYNC_TIMELINE``; ``None`` when it is off."""
    path = _os.environ.get("MPISYNC_TIMELINE", "").strip()
    if not path:
        return None
    return path.replace("{rank}", str(rank)) if "{rank}" in path else f"{path}.rank{rank}.json"


class Timeline:
    """Complete ("X") events of one rank, written as a Chrome-trace JSON file after each sync."""

    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = rank
        self._events: list = []
        self._origin = _time.perf_counter_ns()
        self._epoch_us = _time.time_ns() // 1000  # lines ranks up on a shared wall clock

    def now(self) -> int:
        """Microseconds on this timeline's clock."""
        return self._epoch_us + (_time.perf_counter_ns() - self._origin) // 1000

    def span(self, name: str, start_us: int, end_us: int | None = None, **args) -> None:
        """Record phase ``name`` from ``start_us`` to ``end_us`` (default: now)."""
        end_us = self.now() if end_us is None else end_us
        if len(self._events) < _MAX_EVENTS:
            self._events.append({"name": name, "cat": "mpisync", "ph": "X", "ts": start_us,
                                 "dur": max(0, end_us - start_us), "pid": self.rank, "tid": 0, "args": args})

    def flush(self) -> None:
        """Write every event so far (the file is replaced, never half-written)."""
        doc = {"traceEvents": [{"name": "process_name", "ph": "M", "pid": self.rank,
                                "args": {"name": f"rank {self.rank}"}}] + self._events,
               "displayTimeUnit": "ms"}
        tmp = f"{self.path}.tmp{_os.getpid()}"
        with open(tmp, "w") as f:
            _json.dump(doc, f)
        _os.replace(tmp, self.path)


_timelines: dict = {}
_lock = _threading.Lock()


def timeline_for(rank: int) -> Timeline | None:
    """This process's timeline for ``rank`` when ``MPISYNC_TIMELINE`` is set, else ``None``."""
    path = timeline_path(rank)
    if path is None:
        return None
    with _lock:
        timeline = _timelines.get(path)
        if timeline is None:
            timeline = _timelines[path] = Timeline(path, rank)
        return timeline
