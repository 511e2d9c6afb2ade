"""Logging (``logging.getLogger("mpisync")``) and the Chrome-trace timeline of each rank.

``MPISYNC_LOG=debug`` (or ``info``) attaches a stderr handler that prefixes the
rank, unless the application configured the ``mpisync`` logger itself.
``MPISYNC_TIMELINE=PATH`` writes one Chrome-trace JSON per rank (``PATH`` with
``{rank}`` replaced, else ``PATH.rank<N>.json``), viewable in chrome://tracing
or Perfetto, or drawn as a PNG by ``mpisync timeline``: phases validate, pack,
broadcast, unpack, fan-out, verify, and the other transports' spans
(cross-memory, device); one span per all-reduce call
(``allreduce``), per torch backend operation (``torch all_reduce``, ...) and per
``stage-checkpoint``. Events are appended after each sync, else once a second
or every 4096 events, at a constant cost per event; the file is valid JSON at
every moment, and stops growing at 64 MiB (a warning says so). A
``ParamSync`` or ``GradSync`` reads ``MPISYNC_TIMELINE`` at its first call.
"""

from __future__ import annotations

import atexit as _atexit
import collections as _collections
import json as _json
import logging as _logging
import os as _os
import threading as _threading
import time as _time

from ..config import LOG_LEVELS
from . import safefiles

__all__ = ["logger", "configure_logging", "Timeline", "timeline_for", "timeline_path"]

logger = _logging.getLogger("mpisync")
_configured = False
_FLUSH_EVENTS = 4096  # a sync with more spans than this writes them in pieces
_FLUSH_US = 1_000_000  # spans recorded outside a sync (all-reduces, torch operations): written
# at least this often
_MAX_BYTES = 64 << 20  # a trace file stops growing here: a long job's tracing stays bounded
_ENCODER = _json.JSONEncoder(separators=(",", ":"), default=str)  # one encoder: no set-up per event


def configure_logging(rank: int) -> None:
    """Honour ``MPISYNC_LOG`` once per process (no-op if unset or already configured)."""
    global _configured
    if _configured:
        return
    _configured = True
    level = _os.environ.get("MPISYNC_LOG", "").strip().lower()
    # an unknown level is refused by config.resolve: every sync raises it, none logs
    if level not in LOG_LEVELS or logger.handlers:
        return
    handler = _logging.StreamHandler()
    handler.setFormatter(_logging.Formatter(f"mpisync[rank {rank}] %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(getattr(_logging, level.upper()))
    logger.propagate = False


def timeline_path(rank: int) -> str | None:
    """Where this rank's timeline goes, from ``MPISYNC_TIMELINE``; ``None`` when it is off."""
    path = _os.environ.get("MPISYNC_TIMELINE", "").strip()
    if not path:
        return None
    return path.replace("{rank}", str(rank)) if "{rank}" in path else f"{path}.rank{rank}.json"


class Timeline:
    """Complete ("X") events of one rank, streamed to a Chrome-trace JSON file.

    The file is a valid JSON document at every moment: it is created holding
    the process-name event, and each :meth:`flush` appends the events recorded
    since the last one with a single ``pwrite`` over the closing ``]}`` (and a
    new ``]}`` after them). So the cost per event is constant (nothing is
    rewritten), and a job that dies leaves every event up to its last flush.
    """

    _TAIL = b"]}\n"

    def __init__(self, path: str, rank: int):
        self.path = path
        self.rank = rank
        # appended by any thread without the lock; the flush takes what is there
        self._pending: _collections.deque = _collections.deque()
        self._lock = _threading.Lock()
        self._origin = _time.perf_counter_ns()
        self._epoch_us = _time.time_ns() // 1000  # lines ranks up on a shared wall clock
        head = _json.dumps(
            {
                "displayTimeUnit": "ms",
                "traceEvents": [
                    {
                        "name": "process_name",
                        "ph": "M",
                        "pid": rank,
                        "args": {"name": f"rank {rank}"},
                    }
                ],
            }
        )
        body = head[:-2].encode() + self._TAIL  # ``...}]}`` -> ``...}`` + ``]}\n``
        self._fd = safefiles.create(path, 0o644, body)
        self._end = len(body) - len(self._TAIL)  # where the next events go (over the tail)
        self._flushed_us = self.now()
        _atexit.register(self.close)

    def now(self) -> int:
        """Microseconds on this timeline's clock."""
        return self._epoch_us + (_time.perf_counter_ns() - self._origin) // 1000

    def span(self, name: str, start_us: int, end_us: int | None = None, **args) -> None:
        """Record phase ``name`` from ``start_us`` to ``end_us`` (default: now); written at the
        next flush."""
        end_us = self.now() if end_us is None else end_us
        self._pending.append((name, start_us, max(0, end_us - start_us), args))
        if len(self._pending) >= _FLUSH_EVENTS or end_us - self._flushed_us >= _FLUSH_US:
            self.flush()

    def span_since(self, name: str, monotonic_start: float, **args) -> None:
        """Record ``name`` from ``monotonic_start`` (a ``time.monotonic()`` reading) to now."""
        end_us = self.now()
        start_us = end_us - int((_time.monotonic() - monotonic_start) * 1e6)
        self.span(name, start_us, end_us, **args)

    def flush(self) -> None:
        """Append the events recorded since the last flush (one write; the file stays valid
        JSON)."""
        with self._lock:
            pending = self._pending
            events = [pending.popleft() for _ in range(len(pending))]
            self._flushed_us = self.now()
            if not events or self._fd < 0:
                return
            pid = self.rank
            encode = _ENCODER.encode
            chunk = (
                "".join(
                    f',\n{{"name":{encode(name)},"cat":"mpisync","ph":"X","ts":{int(ts)},"dur":{int(dur)},'
                    f'"pid":{pid},"tid":0,"args":{encode(args)}}}'
                    for name, ts, dur, args in events
                ).encode()
                + self._TAIL
            )
            if self._end + len(chunk) > _MAX_BYTES:
                self._stop(f"it reached {_MAX_BYTES >> 20} MiB")
                return
            try:
                written = _os.pwrite(self._fd, chunk, self._end)
            except OSError as exc:  # a full disk must not fail a sync: stop tracing instead
                self._stop(f"writing failed ({exc})")
                return
            if written == len(chunk):
                self._end += len(chunk) - len(self._TAIL)

    def _stop(self, why: str) -> None:
        """Stop tracing (the lock held): the file keeps what it holds, valid JSON."""
        logger.warning("MPISYNC_TIMELINE: %s: %s; tracing stops", self.path, why)
        _os.close(self._fd)
        self._fd = -1

    def close(self) -> None:
        """Flush and close the file (also run at interpreter exit)."""
        self.flush()
        with self._lock:
            if self._fd >= 0:
                _os.close(self._fd)
                self._fd = -1


_timelines: dict = {}
_unwritable: set = set()
_lock = _threading.Lock()


def timeline_for(rank: int) -> Timeline | None:
    """This process's timeline for ``rank`` when ``MPISYNC_TIMELINE`` is set, else ``None``.

    A trace file that cannot be created is a warning, not an error: this runs on each rank
    before the ranks agree, and a rank that raised here would leave the others waiting.
    """
    path = timeline_path(rank)
    if path is None:
        return None
    with _lock:
        timeline = _timelines.get(path)
        if timeline is None and path not in _unwritable:
            try:
                timeline = Timeline(path, rank)
            except OSError as exc:
                logger.warning(
                    "MPISYNC_TIMELINE: cannot write %s (%s); no timeline on rank %d",
                    path,
                    exc,
                    rank,
                )
                _unwritable.add(path)
                return None
            _timelines[path] = timeline
        return timeline
