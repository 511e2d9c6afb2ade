"""Unit tests of the reference build_plan (tests/reference_plan.py), and of
mpisync.plan.transfers.bulk_plan posting the collectives it does."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_plan import build_plan


def _covered(plan, sizes):
    seen = [np.zeros(n, np.int32) for n in sizes]
    for t in plan:
        assert t.nbytes == sum(p[3] for p in t.pieces)
        for index, start, offset, n in t.pieces:
            seen[index][start : start + n] += 1
            if t.fused:
                assert 0 <= offset and offset + n <= t.nbytes
    return seen


@pytest.mark.parametrize("fusion,chunk", [(0, 1 << 30), (100, 1 << 30), (100, 37), (1 << 20, 64)])
def test_plan_moves_every_byte_exactly_once(fusion, chunk):
    sizes = [0, 5, 99, 100, 101, 0, 250, 3, 3, 1000, 0]
    plan = build_plan(sizes, fusion, chunk)
    for count in _covered(plan, sizes):
        assert (count == 1).all()
    for t in plan:
        assert t.nbytes <= max(fusion, chunk)
        if t.fused:
            assert t.nbytes <= fusion and all(sizes[p[0]] < fusion for p in t.pieces)
        else:
            assert t.nbytes <= chunk
    completed = sorted(i for t in plan for i in t.completes)
    assert len(completed) == len(set(completed))  # each parameter completes once at most
    assert set(range(10)) <= set(completed)  # a trailing empty one may complete with no transfer


def test_plan_without_fusion_has_one_transfer_per_nonempty_tensor():
    plan = build_plan([4, 0, 8], 0)
    assert [(t.fused, t.pieces) for t in plan] == [
        (False, ((0, 0, 0, 4),)),
        (False, ((2, 0, 0, 8),)),
    ]
    assert plan[1].completes == (1, 2)


@given(
    st.lists(st.sampled_from([0, 1, 3, 7, 8, 9, 15, 16, 17, 40, 100]), max_size=40),
    st.sampled_from([0, 1, 8, 16, 17, 64]),
    st.sampled_from([1, 5, 16, 1 << 30]),
)
@settings(max_examples=300, deadline=None)
def test_bulk_plan_posts_the_collectives_build_plan_does(sizes, fusion, chunk):
    from mpisync.plan.transfers import bulk_plan

    expected = build_plan(sizes, fusion, chunk)
    got = bulk_plan(np.array(sizes, dtype=np.int64), fusion, chunk)
    assert [(t.fused, t.nbytes) for t in expected] == [(f, n) for f, _, _, n in got]
    for t, (fused, first, last, _nbytes) in zip(expected, got):
        if fused:  # the same tensors, in the same order (empty ones carry nothing)
            assert [p[0] for p in t.pieces] == [i for i in range(first, last) if sizes[i]]
        else:
            assert t.pieces[0][:2] == (first, last)
