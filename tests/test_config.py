"""Unit tests of mpisync.config.resolve: where each setting comes from, and bad values refused."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import mpisync
from mpisync import InvalidParamError, config
from mpisync.config import (
    KNOWN_ENV,
    SWITCHES,
    environment_problems,
    resolve,
    switch,
    unknown_settings,
)


def test_settings_sources(monkeypatch):
    monkeypatch.delenv("MPISYNC_MAX_CONCURRENT", raising=False)
    monkeypatch.setenv("MPISYNC_FUSION_BYTES", "4096")
    monkeypatch.setenv("MPISYNC_TIMEOUT", "none")
    s = resolve(max_concurrent=None, fusion_bytes=None, gpu_transport="STAGED")
    assert (s.max_concurrent.source, s.fusion_bytes.value, s.fusion_bytes.source) == (
        "built-in",
        4096,
        "environment",
    )
    assert (s.gpu_transport.value, s.gpu_transport.source) == ("staged", "argument")
    assert s.timeout.value is None
    assert resolve(fusion_bytes=7).fusion_bytes.value == 7
    monkeypatch.setenv("MPISYNC_MAX_CONCURRENT", "zero")
    with pytest.raises(InvalidParamError, match="MPISYNC_MAX_CONCURRENT"):
        resolve()
    with pytest.raises(InvalidParamError, match="gpu_transport"):
        resolve(max_concurrent=1, gpu_transport="carrier-pigeon")


SWITCH_NAMES = (
    "MPISYNC_CROSS_MEMORY",
    "MPISYNC_SPEEDUPS",
    "MPISYNC_TIMEOUT_ABORT",
    "MPISYNC_ALLOW_SINGLETON",
)


@pytest.mark.parametrize("name", SWITCH_NAMES)
def test_switches_take_only_on_and_off(monkeypatch, name):
    for raw, value in (("1", True), ("TRUE", True), ("Yes", True), ("on", True)):
        monkeypatch.setenv(name, raw)
        assert switch(name) is value and environment_problems() == []
        resolve()
    for raw in ("0", "false", "NO", "Off"):
        monkeypatch.setenv(name, raw)
        assert switch(name) is False and environment_problems() == []
    for raw in ("ture", "of", "2", "enabled"):
        monkeypatch.setenv(name, raw)
        with pytest.raises(InvalidParamError) as info:
            resolve()
        assert str(info.value) == (
            f"{name}: an on/off switch takes 1, 0, true, false, yes, no, on or off (any case), "
            f"got {raw!r}"
        )
        assert switch(name) is SWITCHES[name]  # readers never raise: resolve() refuses first


def test_log_level_takes_only_known_levels(monkeypatch):
    monkeypatch.setenv("MPISYNC_LOG", "DEBUG")
    resolve()
    monkeypatch.setenv("MPISYNC_LOG", "dbug")
    with pytest.raises(InvalidParamError, match="MPISYNC_LOG: a log level takes debug, info, "):
        resolve()


def test_problems_are_reported_together(monkeypatch):
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "ture")
    monkeypatch.setenv("MPISYNC_LOG", "loud")
    with pytest.raises(InvalidParamError) as info:
        resolve()
    assert str(info.value).startswith("MPISYNC_CROSS_MEMORY: an on/off switch")
    assert "; MPISYNC_LOG: a log level takes" in str(info.value)


def test_unknown_names_are_warned_once_with_the_closest_known(monkeypatch):
    monkeypatch.setenv("MPISYNC_TIMOUT", "5")
    monkeypatch.setenv("MPISYNC_ZEBRA", "1")
    assert unknown_settings() == [("MPISYNC_TIMOUT", "MPISYNC_TIMEOUT"), ("MPISYNC_ZEBRA", None)]
    monkeypatch.setattr(config, "_scanned", False)
    monkeypatch.setattr(config, "_warned", set())
    monkeypatch.setattr(config, "_world_rank", lambda: 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve()  # on the other ranks of a job: no warning
    monkeypatch.setattr(config, "_scanned", False)
    monkeypatch.setattr(config, "_warned", set())
    monkeypatch.setattr(config, "_world_rank", lambda: 0)
    with pytest.warns(UserWarning) as caught:
        resolve()
        resolve()
    messages = [str(w.message) for w in caught]
    assert messages == [
        "mpisync: MPISYNC_TIMOUT is not an mpisync setting and is ignored; did you mean "
        "MPISYNC_TIMEOUT? (`mpisync info` lists every setting)",
        "mpisync: MPISYNC_ZEBRA is not an mpisync setting and is ignored (`mpisync info` lists "
        "every setting)",
    ]
    assert caught[0].filename == __file__  # it points at the caller's line


def test_every_mpisync_variable_in_the_project_is_known():
    # Every MPISYNC_* name the package, the CI scripts, the benchmarks and examples read is in the
    # one list, so none of them is ever reported as unknown.
    root = Path(__file__).resolve().parents[1]
    used = set()
    for folder in ("mpisync", "ci", "benchmarks", "examples"):
        for path in (root / folder).rglob("*"):
            if path.suffix in (".py", ".sh", ".sbatch", ".c") and path.is_file():
                used |= set(re.findall(r"\bMPISYNC_[A-Z][A-Z_]*[A-Z]\b", path.read_text()))
    assert used and sorted(used - KNOWN_ENV) == []
    assert {"MPISYNC_TIMEOUT", "MPISYNC_CROSS_MEMORY", "MPISYNC_TEST_LOGS"} <= used


def test_a_bad_switch_stops_every_sync_naming_it(monkeypatch):
    monkeypatch.setenv("MPISYNC_CROSS_MEMORY", "of")  # was read as "on"
    with pytest.raises(InvalidParamError, match=r"rank 0: MPISYNC_CROSS_MEMORY: an on/off switch"):
        mpisync.sync_params({"w": np.zeros(3)}, MPI.COMM_SELF)
    with pytest.raises(InvalidParamError, match=r"rank 0: MPISYNC_CROSS_MEMORY: an on/off switch"):
        mpisync.allreduce({"w": np.zeros(3)}, MPI.COMM_SELF)
