"""Unit tests of mpisync.plan.arena: an Arena's gather and scatter on its compiled, vectored and
loop paths."""

import numpy as np
import pytest

from unitutil import ARENA_PATHS, arena_path


@pytest.mark.parametrize("path", list(ARENA_PATHS))
def test_arena_gather_then_scatter_round_trips_more_buffers_than_one_system_call_takes(path):
    from mpisync.plan.arena import Arena, copy_list

    arena = Arena(1 << 16, **arena_path(path))
    if path == "vectored":
        assert arena.vectored == hasattr(__import__("os"), "memfd_create")
    # 2100 non-empty
    sources = [np.full(n, i % 251, np.uint8) for i, n in enumerate([3, 0, 1, 17] * 700)]
    copies = copy_list(100, [memoryview(a) for a in sources])
    assert sum(len(group) for _, group, _, _ in copies) == 2100 and len(copies) >= 3
    arena.view[:100] = b"\xab" * 100
    arena.gather(copies)
    expected = np.concatenate(sources)
    assert bytes(arena.view[100 : 100 + expected.size]) == expected.tobytes()
    assert bytes(arena.view[:100]) == b"\xab" * 100  # nothing written before the offset
    targets = [np.zeros_like(a) for a in sources]
    arena.scatter(copy_list(100, [memoryview(a) for a in targets]))
    for a, b in zip(sources, targets):
        assert a.tobytes() == b.tobytes()
