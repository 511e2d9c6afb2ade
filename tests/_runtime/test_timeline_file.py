"""The trace file's bounds: a size cap, and spans recorded outside a sync written within a
second."""

import json
import logging
import time

from mpisync._runtime import observe


def _events(path) -> list:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]


def test_the_file_stops_growing_at_its_cap_and_stays_valid(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(observe, "_MAX_BYTES", 4096)
    path = tmp_path / "capped.json"
    timeline = observe.Timeline(str(path), 0)
    with caplog.at_level(logging.WARNING, logger="mpisync"):
        for flush in range(100):
            timeline.span("allreduce", timeline.now(), tensors=flush)
            timeline.flush()
    timeline.close()
    assert path.stat().st_size <= 4096
    kept = _events(path)
    assert 10 < len(kept) < 100
    assert [e["args"]["tensors"] for e in kept] == list(range(len(kept)))
    assert [r.getMessage() for r in caplog.records] == [
        f"MPISYNC_TIMELINE: {path}: it reached 0 MiB; tracing stops"
    ]


def test_spans_outside_a_sync_are_written_within_a_second(tmp_path, monkeypatch):
    path = tmp_path / "steps.json"
    timeline = observe.Timeline(str(path), 1)
    timeline.span("allreduce", timeline.now())
    assert _events(path) == []  # buffered
    time.sleep(1.05)
    timeline.span("allreduce", timeline.now())  # a second later: both written
    assert [e["name"] for e in _events(path)] == ["allreduce", "allreduce"]
    started = time.monotonic()
    time.sleep(0.01)
    timeline.span_since("torch all_reduce", started, ok=True)
    timeline.close()
    last = _events(path)[-1]
    assert last["name"] == "torch all_reduce" and last["args"] == {"ok": True}
    assert 10_000 <= last["dur"] < 1_000_000
