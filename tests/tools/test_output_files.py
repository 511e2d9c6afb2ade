"""The command line's output files (bench --json/--csv, tune --output, timeline --out) are written
as every mpisync file is (mpisync._runtime.safefiles): never through a symlink, never into a folder
another user may write into, and such a path is the command's usage error before any work."""

import json

import pytest

from mpisync._runtime.safefiles import UnsafePathError
from mpisync.tools.bench import output
from mpisync.tools.outputs import prepare_output

from unitutil import folder_of_another_user


def test_bench_json_through_a_planted_symlink_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("must stay")
    (tmp_path / "b.json").symlink_to(victim)
    with pytest.raises(UnsafePathError) as info:
        output.write_json({"a": 1}, str(tmp_path / "b.json"))
    assert f"refusing to write {tmp_path}/b.json: it is a symbolic link" in str(info.value)
    assert victim.read_text() == "must stay"
    output.write_json({"a": 1}, str(tmp_path / "c.json"))
    assert json.loads((tmp_path / "c.json").read_text()) == {"a": 1}


def test_an_output_in_a_folder_another_user_may_write_into_is_a_usage_error(tmp_path):
    shared = folder_of_another_user(tmp_path)
    why = prepare_output(str(shared / "b.csv"), "--csv")
    assert why.startswith(f"--csv: mpisync: refusing to write {shared}/b.csv: its folder"), why
    assert "belongs to another user (uid 65534" in why
    assert list(shared.iterdir()) == []


def test_a_symlinked_output_is_a_usage_error(tmp_path):
    (tmp_path / "plot.png").symlink_to(tmp_path / "elsewhere.png")
    why = prepare_output(str(tmp_path / "plot.png"), "--plot")
    assert "it is a symbolic link" in why
    assert prepare_output(str(tmp_path / "new" / "plot.png"), "--plot") == ""
