"""Unit tests of mpisync.transports.hugepages: a range collapsed into huge pages the second time
it is seen and never again, its bytes unchanged, nothing done with ``MPISYNC_HUGE_PAGES=0``."""

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
    assert hugepages._seen == {(array.ctypes.data, array.ctypes.data + 3 * _HUGE): True}


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


def test_arrays_under_one_aligned_huge_page_are_left_alone(monkeypatch):
    monkeypatch.setattr(hugepages, "_seen", {})
    small = np.zeros(_HUGE, np.uint8)[1:]  # no whole aligned 2 MiB inside
    hugepages.advise([small])
    hugepages.advise([small])
    assert hugepages._seen == {}


def test_the_memory_of_ranges_is_bounded(monkeypatch):
    monkeypatch.setattr(hugepages, "_seen", {(k * _HUGE, (k + 1) * _HUGE): False for k in range(5)})
    monkeypatch.setattr(hugepages, "_MEMORY", 5)
    array = _fresh(_HUGE)
    hugepages.advise([array])
    assert list(hugepages._seen) == [(array.ctypes.data, array.ctypes.data + _HUGE)]
