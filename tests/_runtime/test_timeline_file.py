"""The trace file's bounds: a size cap, and spans recorded outside a sync written within a
second."""

import json
import logging
import os
import stat
import time

from mpisync._runtime import observe

from unitutil import folder_of_another_user


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


def _fresh(monkeypatch, path) -> None:
    monkeypatch.setenv("MPISYNC_TIMELINE", str(path))
    monkeypatch.setattr(observe, "_timelines", {})
    monkeypatch.setattr(observe, "_unwritable", set())


def test_a_symlink_planted_in_a_shared_folder_is_never_written_through(
    tmp_path, monkeypatch, caplog
):
    """``MPISYNC_TIMELINE=<shared>/trace`` where another user (uid 65534; tests run as root)
    owns the folder, writable by all, and planted ``trace.rank0.json`` as a symlink: no trace, a
    warning naming the path and why, the symlink's target untouched."""
    shared = folder_of_another_user(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("must stay")
    (shared / "trace.rank0.json").symlink_to(victim)
    _fresh(monkeypatch, shared / "trace")
    with caplog.at_level(logging.WARNING, logger="mpisync"):
        assert observe.timeline_for(0) is None
    assert victim.read_text() == "must stay"
    assert sorted(p.name for p in shared.iterdir()) == ["trace.rank0.json"]
    shown = " ".join(r.getMessage() for r in caplog.records)
    assert f"refusing to write {shared}/trace.rank0.json: its folder {shared} is not safe" in shown


def test_a_symlink_or_a_hard_link_at_the_trace_name_is_not_written_through(
    tmp_path, monkeypatch, caplog
):
    victim = tmp_path / "victim"
    victim.write_text("must stay")
    (tmp_path / "trace.rank0.json").symlink_to(victim)
    os.link(victim, tmp_path / "trace.rank1.json")  # a previous file's name, shared with another
    _fresh(monkeypatch, tmp_path / "trace")
    with caplog.at_level(logging.WARNING, logger="mpisync"):
        assert observe.timeline_for(0) is None
    assert "it is a symbolic link" in " ".join(r.getMessage() for r in caplog.records)
    timeline = observe.timeline_for(1)  # replaced by a new file, not truncated in place
    assert timeline is not None
    timeline.span("allreduce", timeline.now())
    timeline.close()
    assert victim.read_text() == "must stay"
    assert [e["name"] for e in _events(tmp_path / "trace.rank1.json")] == ["allreduce"]
    assert stat.S_IMODE((tmp_path / "trace.rank1.json").stat().st_mode) & 0o022 == 0
