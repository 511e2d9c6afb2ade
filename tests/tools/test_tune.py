"""``mpisync tune``: options checked on every rank before anything is measured, and a tuning file
written whole through a fresh name (never through a name planted beforehand)."""

import json
import os
import time
from types import SimpleNamespace

import pytest

from mpisync._runtime.safefiles import UnsafePathError
from mpisync.tools import tune
from mpisync.transports import tuning

from unitutil import folder_of_another_user

launcher = pytest.mark.launcher


def test_the_file_is_written_through_a_fresh_name_not_a_planted_one(tmp_path):
    target = tmp_path / "tuning.json"
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    # every name the old writer used (<path>.<pid>.tmp), planted in advance for the next pids
    for pid in range(os.getpid(), os.getpid() + 50):
        (tmp_path / f"tuning.json.{pid}.tmp").symlink_to(victim)
    tune.write_file(str(target), '{"format": 1}')
    assert victim.read_text() == "not yours"
    assert not target.is_symlink() and json.loads(target.read_text()) == {"format": 1}
    assert oct(target.stat().st_mode & 0o777) == oct(0o644 & ~_umask())
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".tmp")) == [
        "tuning.json",
        "victim",
    ]


def test_a_symlink_at_the_target_is_refused_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    target = tmp_path / "tuning.json"
    target.symlink_to(victim)
    with pytest.raises(UnsafePathError) as info:
        tune.write_file(str(target), "{}")
    assert f"refusing to write {target}: it is a symbolic link" in str(info.value)
    assert victim.read_text() == "not yours" and target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.json", "victim"]


def test_a_folder_another_user_may_write_into_is_refused(tmp_path):
    """MPISYNC_TUNING in a folder another user made writable by all: that user could plant a
    symlink or replace the file, so nothing is written (tests run as root: "another user" is a
    folder chown'ed to nobody)."""
    shared = folder_of_another_user(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("not yours")
    (shared / "tuning.json").symlink_to(victim)
    why = f"its folder {shared} is not safe: it belongs to another user (uid 65534"
    with pytest.raises(UnsafePathError) as info:
        tune.write_file(str(shared / "tuning.json"), "{}")
    assert f"refusing to write {shared}/tuning.json: {why}" in str(info.value)
    assert victim.read_text() == "not yours"
    assert sorted(p.name for p in shared.iterdir()) == ["tuning.json"]
    assert why in tune.problem(SimpleNamespace(rounds=1, output=str(shared / "tuning.json")))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_options_are_checked_before_measuring(tmp_path):
    assert tune.problem(SimpleNamespace(rounds=0, output=None)) == "--rounds must be >= 1, got 0"
    assert "is a folder" in tune.problem(SimpleNamespace(rounds=1, output=str(tmp_path)))
    assert tune.problem(SimpleNamespace(rounds=1, output=str(tmp_path / "new" / "t.json"))) == ""
    assert (tmp_path / "new").is_dir()  # the output's folder is made before measuring


def test_a_bad_setting_is_refused_before_measuring(tmp_path, monkeypatch):
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "of")
    assert tune.problem(SimpleNamespace(rounds=1, output=str(tmp_path / "t.json"))) == (
        "MPISYNC_CROSS_MEMORY: an on/off switch takes 1, 0, true, false, yes, no, on or off (any "
        "case), got 'of' (see `mpisync info`)"
    )


def test_a_huge_tuning_file_is_not_read(tmp_path, monkeypatch):
    path = tmp_path / "tuning.json"
    with open(path, "wb") as f:  # sparse: 300 MB that take no disk
        f.truncate(300 << 20)
    monkeypatch.setenv("MPISYNC_TUNING", str(path))
    opened = []
    monkeypatch.setattr(tuning, "open", lambda *a, **k: opened.append(a) or 1 / 0, raising=False)
    assert tuning.load() is None and opened == []
    assert tuning.lookup("2x1")[0] == {}


@launcher
@pytest.mark.parametrize("bad", ["--rounds 0", "--output FOLDER"])
def test_a_bad_option_ends_every_rank_at_once_with_status_2(installed, bounded_env, tmp_path, bad):
    args = bad.replace("FOLDER", str(tmp_path)).split()
    start = time.monotonic()
    proc = installed.run(["tune", *args], bounded_env, ranks=2, timeout=90)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("mpisync tune: error:") == 1 and "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary left


@launcher
def test_tune_writes_a_file_the_rule_then_reads(installed, bounded_env, tmp_path):
    out = tmp_path / "tuned" / "tuning.json"
    proc = installed.run(
        ["tune", "--rounds", "1", "--output", out], bounded_env, ranks=2, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    assert doc["identity"]["layout"] == "2x1" and set(doc["entries"]) == {"small", "large"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["tuning.json"]
