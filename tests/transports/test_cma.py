"""Unit tests of mpisync.transports.cma: byte ranges of root's share, and regions batched for the
copies."""

import numpy as np


def test_cross_memory_byte_ranges_cut_pieces_at_the_share():
    from mpisync.transports.cma import _byte_range

    local = np.array([(100, 10), (200, 5), (300, 20)], dtype=np.int64)
    remote = np.array([(1000, 10), (2000, 5), (3000, 20)], dtype=np.int64)
    assert _byte_range(local, remote, 8, 17) == [(108, 1008, 2), (200, 2000, 5), (300, 3000, 2)]
    whole = _byte_range(local, remote, 0, 35)
    assert whole == [(100, 1000, 10), (200, 2000, 5), (300, 3000, 20)]
    assert _byte_range(local, remote, 0, 0) == [] and _byte_range(local, remote, 35, 35) == []
    split = _byte_range(local, remote, 0, 12) + _byte_range(local, remote, 12, 35)
    # root's share and the receiver's rest cover every byte once
    assert sum(n for _, _, n in split) == 35


def test_cross_memory_regions_read_gaps_under_a_page_into_scratch():
    from mpisync.transports.cma import _batches, _regions

    # remote (root) pieces out of order, one of them empty; local (receiver) addresses anywhere
    remote = np.array([(1100, 50), (1000, 100), (1150, 0), (1200, 10), (9000, 8)], dtype=np.int64)
    local = np.array(
        [(50_000, 50), (60_000, 100), (70_000, 0), (80_000, 10), (90_000, 8)], dtype=np.int64
    )
    pairs = _regions(local, remote, scratch=7)
    assert pairs == [
        (60_000, 1000, 100),
        (50_000, 1100, 50),
        (7, 1150, 50),
        (80_000, 1200, 10),
        (90_000, 9000, 8),
    ]
    ((_, _, _, nlocal, remote_iov, nremote, nbytes),) = _batches(None, 0, pairs)
    # 1000..1210 is one remote range (a gap of 50 bytes read into scratch); 9000 is past a page: its
    # own
    assert (nlocal, nremote, nbytes) == (5, 2, 218)
    assert [(remote_iov[i].base, remote_iov[i].len) for i in range(nremote)] == [
        (1000, 210),
        (9000, 8),
    ]
