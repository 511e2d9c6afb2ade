"""Unit tests of mpisync.plan.program: a compiled bucket's step, and the arena slots fused buckets
take."""

import numpy as np
import pytest

from mpisync.params.layout import NO_RUNS
from mpisync.plan.transfers import bulk_plan

from unitutil import ARENA_PATHS, arena_path


@pytest.mark.parametrize("path", list(ARENA_PATHS))
def test_compiled_bucket_fills_masters_and_every_replica_from_the_arena(path):
    from mpisync.params.manifest import build_manifest
    from mpisync.plan.arena import Arena
    from mpisync.plan.program import compile_program

    counts = [1, 3, 2, 3, 1, 2]  # replica runs break and restart inside one bucket
    params = {f"p{i}": [np.zeros(5 + i, np.int16) for _ in range(c)] for i, c in enumerate(counts)}
    manifest = build_manifest(params, rank=1, size=2, root=0)
    host = manifest.host_params
    columns = manifest.host_columns(NO_RUNS, 1 << 10)
    plan = bulk_plan(columns.sizes, 1 << 10, 1 << 30)
    assert plan == [(True, 0, len(counts), sum(p.nbytes for p in host))]
    arena = Arena(1 << 10, **arena_path(path))
    (step,) = compile_program(columns, plan, receiving=True, arena=arena, fusion_bytes=1 << 10)
    assert step.pack == ()
    arena.view[: plan[0][3]] = np.arange(plan[0][3], dtype=np.uint8).tobytes()
    step.finish()
    offset = 0
    for param in host:
        for replica in param.replicas:
            assert bytes(replica.data) == bytes(range(offset, offset + param.nbytes))
        offset += param.nbytes


def test_fused_buckets_take_two_slots_on_one_node_and_one_per_collective_across_nodes():
    from mpisync.plan.program import FUSED_SLOTS, fused_slots

    assert FUSED_SLOTS == 2
    assert [fused_slots(16, n, True) for n in (1, 2, 13)] == [1, 2, 2]
    assert [fused_slots(16, n, False) for n in (1, 2, 13, 40)] == [1, 2, 13, 16]
    assert fused_slots(1, 13, True) == fused_slots(1, 13, False) == 1
