"""Unit tests of mpisync.transports.hugepages: every 2 MiB block an array touches collapsed into
huge pages the second time the array is seen and never again for it, the bytes unchanged (its own
and its neighbours'), nothing done with ``MPISYNC_HUGE_PAGES=0``."""

import mmap

import numpy as np
import pytest

from mpisync.transports import hugepages

_HUGE = 2 << 20


def _huge_kib(address: int) -> int:
    """``AnonHugePages`` of the mapping holding ``address`` (kB, from /proc/self/smaps)."""
    inside, kib = False, 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, stop = (int(x, 16) for x in head.split("-"))
                inside = start <= address < stop
            elif inside and head == "AnonHugePages:":
                kib = int(line.split()[1])
    return kib


def _fresh(nbytes: int) -> np.ndarray:
    """A private anonymous mapping of ``nbytes`` on 4 KiB pages, written: advised against huge
    pages first, so that a kernel whose THP mode is ``always`` does not give it huge pages at
    the first write (``MADV_HUGEPAGE`` lifts that advice)."""
    region = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    array = np.frombuffer(region, np.uint8)
    start = -(-array.ctypes.data // _HUGE) * _HUGE - array.ctypes.data  # 2 MiB-aligned inside
    out = array[start : start + nbytes]
    out[...] = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
    return out


@pytest.fixture
def collapsing(monkeypatch):
    """Skip unless this kernel collapses an advised range (a fact of this machine); a clean
    memory of ranges."""
    monkeypatch.setattr(hugepages, "_seen", {})
    if hugepages._madvise is None:
        pytest.skip("no madvise here")
    probe = _fresh(2 * _HUGE)
    hugepages.advise([probe])
    hugepages.advise([probe])
    if _huge_kib(probe.ctypes.data) == 0:
        pytest.skip("this kernel does not collapse ranges into huge pages (MADV_COLLAPSE)")
    hugepages._seen.clear()


def test_a_range_is_collapsed_the_second_time_it_is_seen_with_its_bytes(collapsing, monkeypatch):
    array = _fresh(3 * _HUGE)
    before = array.copy()
    answers = []
    real = hugepages._madvise

    def answered(start, length, advice):
        answers.append((advice, real(start, length, advice)))
        return answers[-1][1]

    monkeypatch.setattr(hugepages, "_madvise", answered)
    assert _huge_kib(array.ctypes.data) == 0
    hugepages.advise([array])
    assert _huge_kib(array.ctypes.data) == 0 and answers == []  # seen once: left alone
    hugepages.advise([array, array])  # twice in one call counts as one sighting
    assert [advice for advice, _ in answers] == [hugepages._MADV_HUGEPAGE, hugepages._MADV_COLLAPSE]
    if answers[-1][1] != 0:  # the probe's collapse went through; this one the kernel refused
        pytest.skip("the kernel refused this collapse (no memory to compact just now)")
    assert _huge_kib(array.ctypes.data) >= 2048
    assert array.tobytes() == before.tobytes()
    first = array.ctypes.data // _HUGE
    assert hugepages.collapsed() == {first, first + 1, first + 2}


def test_a_range_twice_in_the_first_call_is_seen_once(collapsing):
    array = _fresh(2 * _HUGE)
    hugepages.advise([array, array[: _HUGE + 5]])
    assert _huge_kib(array.ctypes.data) == 0


def test_a_collapsed_range_is_never_collapsed_again(collapsing, monkeypatch):
    array = _fresh(2 * _HUGE)
    calls = []
    real = hugepages._madvise

    def counted(start, length, advice):
        calls.append(advice)
        return real(start, length, advice)

    monkeypatch.setattr(hugepages, "_madvise", counted)
    for _ in range(5):
        hugepages.advise([array])
    assert calls == [hugepages._MADV_HUGEPAGE, hugepages._MADV_COLLAPSE]


def test_switched_off_nothing_is_advised(collapsing, monkeypatch):
    monkeypatch.setenv("MPISYNC_HUGE_PAGES", "0")
    array = _fresh(2 * _HUGE)
    for _ in range(3):
        hugepages.advise([array])
    assert _huge_kib(array.ctypes.data) == 0 and hugepages._seen == {}


def test_the_memory_of_blocks_is_bounded(monkeypatch):
    monkeypatch.setattr(hugepages, "_seen", {(k, (0, 1)): False for k in range(5)})
    monkeypatch.setattr(hugepages, "_MEMORY", 5)
    array = _fresh(_HUGE)
    hugepages.advise([array])
    assert hugepages._seen == {(array.ctypes.data // _HUGE, (array.ctypes.data, _HUGE)): False}


def test_every_block_an_array_touches_is_taken_with_its_neighbours_bytes(collapsing):
    region = _fresh(3 * _HUGE)  # three aligned blocks; the array starts 4 KiB into the first
    before = region.copy()
    inside = region[4096 : 4096 + 2 * _HUGE]
    hugepages.advise([inside])
    assert hugepages.collapsed() == set()
    hugepages.advise([inside])
    first = region.ctypes.data // _HUGE
    assert hugepages.collapsed() == {first, first + 1, first + 2}
    if _huge_kib(region.ctypes.data) < 3 * 2048:
        pytest.skip("the kernel refused a collapse (no memory to compact just now)")
    assert region.tobytes() == before.tobytes()  # the array's bytes and its neighbours'


def test_each_array_has_its_blocks_collapsed_once_after_its_second_sighting(
    collapsing, monkeypatch
):
    region = _fresh(2 * _HUGE)
    one, other = region[: _HUGE + 4096], region[: _HUGE + 8192]  # two arrays over the same blocks
    collapses = []
    real = hugepages._madvise

    def counted(start, length, advice):
        if advice == hugepages._MADV_COLLAPSE:
            collapses.append((start, length))
        return real(start, length, advice)

    monkeypatch.setattr(hugepages, "_madvise", counted)
    for array in (one, other, one, other, one, other):  # in turn, as memory mapped again may be
        hugepages.advise([array])
    assert collapses == [(region.ctypes.data, 2 * _HUGE)] * 2  # once for each, at its second
    hugepages.advise([region[:4096], region[:8192]])  # two arrays of one call: the first owns it
    assert (region.ctypes.data // _HUGE, (region.ctypes.data, 4096)) in hugepages._seen
    assert (region.ctypes.data // _HUGE, (region.ctypes.data, 8192)) not in hugepages._seen


def test_runs_of_blocks_take_one_pair_of_advice_each():
    assert hugepages._runs([1, 2, 3, 7, 9, 10]) == [[1, 4], [7, 8], [9, 11]]
    assert hugepages._runs([]) == []
    assert hugepages._blocks(_HUGE + 1, 0) == (0, 0)
    assert hugepages._blocks(_HUGE + 1, _HUGE) == (1, 3)
    assert hugepages._blocks(_HUGE, _HUGE) == (1, 2)
