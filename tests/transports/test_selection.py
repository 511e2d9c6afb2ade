"""The transport rule (mpisync.transports.selection) and the tuning file
(mpisync.transports.tuning), without MPI."""

import json
import os

import pytest

from mpisync.transports import selection, tuning
from mpisync.transports.selection import CROSS, MPI, Facts, choose


def facts(**kw):
    base = dict(size=2, one_node=True, cross=True, tuned=(None, None))
    base.update(kw)
    return Facts(**base)


def test_one_node_small_sets_take_mpi_large_ones_cross_memory():
    assert choose(facts(), small=True).channel == MPI
    assert choose(facts(), small=False).channel == CROSS


def test_several_nodes_or_one_rank_take_mpi():
    assert choose(facts(one_node=False), small=True).channel == MPI
    assert choose(facts(one_node=False), small=False, preferred=CROSS).channel == MPI  # not usable
    assert choose(facts(size=1), small=True).channel == MPI


def test_settings_and_failed_set_ups_narrow_the_choice():
    assert choose(facts(cross=False), small=False).channel == MPI
    assert choose(facts(), small=False, unavailable=(CROSS,)).channel == MPI
    assert choose(facts(), small=True, preferred=MPI).channel == MPI


def test_a_tuning_entry_wins_where_usable():
    tuned = facts(tuned=(CROSS, MPI))
    assert choose(tuned, small=True) == (CROSS, "tuning file")
    assert choose(tuned, small=False) == (MPI, "tuning file")
    # not usable
    assert choose(facts(tuned=(CROSS, CROSS), cross=False), small=True).channel == MPI


def test_tuning_file_for_another_machine_library_or_layout_is_ignored(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    monkeypatch.setenv("MPISYNC_TUNING", str(path))
    assert tuning.tuning_path() == str(path)
    assert tuning.lookup("2x1")[0] == {}  # no file
    doc = {
        "format": tuning.FORMAT,
        "identity": tuning.identity("2x1"),
        "entries": {"small": MPI, "large": CROSS},
    }
    path.write_text(json.dumps(doc))
    assert tuning.lookup("2x1")[0] == {"small": MPI, "large": CROSS}
    assert selection.tuned_words("2x1") == (
        selection.CHANNELS.index(MPI),
        selection.CHANNELS.index(CROSS),
    )
    assert tuning.lookup("3x1")[0] == {}  # another layout
    for key in ("machine", "mpi"):
        other = dict(doc, identity=dict(doc["identity"], **{key: "elsewhere"}))
        path.write_text(json.dumps(other) + " " * len(key))  # a new size: the cache sees a new file
        entries, why = tuning.lookup("2x1")
        assert entries == {} and key in why
    path.write_text("[1, 2")  # malformed
    assert tuning.lookup("2x1")[0] == {}


@pytest.mark.parametrize("layout", ["2x1", "4-ranks-multinode"])
def test_facts_name_their_layout(layout):
    size = int(layout[0])
    assert facts(size=size, one_node=layout.endswith("x1")).layout() == layout


@pytest.mark.parametrize("kind", ["deeply nested", "a FIFO", "a folder", "not UTF-8"])
def test_an_unreadable_tuning_file_is_no_tuning_file(tmp_path, monkeypatch, kind):
    # Read before the facts all-reduce: a rank that raised (or blocked) here would leave the others
    # waiting.
    path = tmp_path / "tuning.json"
    if kind == "deeply nested":
        path.write_text("[" * 200_000)
    elif kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a folder":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe{")
    monkeypatch.setenv("MPISYNC_TUNING", str(path))
    assert tuning.load() is None
    assert selection.tuned_words("2x1") == (-1, -1)
