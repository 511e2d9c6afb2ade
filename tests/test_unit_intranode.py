"""Unit tests of mpisync.intranode: the MPISYNC_SHARED_MEMORY setting."""


def test_shared_memory_setting_is_every_set_never_or_small_sets(monkeypatch):
    from mpisync import intranode

    for raw, expected in (("1", True), ("on", True), ("0", False), ("off", False), ("", None), (" ", None)):
        monkeypatch.setenv("MPISYNC_SHARED_MEMORY", raw)
        assert intranode.setting() is expected, raw
    monkeypatch.delenv("MPISYNC_SHARED_MEMORY")
    assert intranode.setting() is None and not intranode.enabled()
