"""Unit tests of mpisync.allreduce.groups and the one plan over them (no MPI): a set with replica
lists, mixed replica counts in one bucket and staged dtypes gives the bytes of an average, and the
plan is the same whichever fusion the groups are cut with."""

import numpy as np
import pytest


def _set(dtypes):
    # name -> replicas: 1, 2 or 3 per name, small (fused) and large (in place, chunked by nothing)
    params = {}
    for i in range(12):
        dtype = dtypes[i % len(dtypes)]
        n = 3 + i if i % 4 else 700
        params[f"p{i:02d}"] = [
            (np.arange(n) % 7 + 2 * k + i).astype(dtype) for k in range(1 + i % 3)
        ]
    return params


def _reduce_as_two_equal_ranks(params, op, fusion):
    """Every step of the set's plan, the collective standing in as two ranks holding the same
    values (``sum``: twice the buffer; ``max``: the buffer)."""
    from mpisync.allreduce.plan import fused_arena
    from mpisync.allreduce.reduceset import ReduceSet
    from mpisync.params.manifest import build_manifest

    manifest = build_manifest(params, rank=0, size=2, root=0, settings={"op": op})
    assert not manifest.errors
    reduced = ReduceSet(manifest, op, 2)
    plan = reduced.plan(fusion)
    arena = fused_arena(plan.arena_bytes)
    steps = reduced.steps(plan, arena)
    reduced.before()
    for step in steps:
        if step.load is not None:
            step.load()
        if op in ("sum", "avg"):
            step.buffer *= 2
        if step.store is not None:
            step.store()
    reduced.after()
    return steps


@pytest.mark.parametrize("fusion", [0, 64, 256, 1 << 20])
@pytest.mark.parametrize("dtypes", [["float32"], ["float32", "float16", "int16"], ["int8"]])
def test_avg_over_replicas_and_ranks_gives_every_replica_the_mean(fusion, dtypes):
    params = _set(dtypes)
    expected = {
        name: (sum(r.astype(np.float64) for r in reps) / len(reps)) for name, reps in params.items()
    }
    steps = _reduce_as_two_equal_ranks(params, "avg", fusion)
    assert any(s.fused for s in steps) == (fusion >= 64)
    for name, replicas in params.items():
        dtype = replicas[0].dtype
        # integers floor, as torch's //; half precision rounds to nearest
        want = (
            np.floor(expected[name]).astype(dtype)
            if dtype.kind in "iu"
            else expected[name].astype(dtype)
        )
        for replica in replicas:
            assert replica.tobytes() == want.tobytes(), name


def test_a_bucket_mixing_replica_counts_divides_each_name_by_its_own():
    from mpisync.allreduce.groups import param_groups
    from mpisync.allreduce.plan import plan_groups
    from mpisync.params.manifest import build_manifest

    params = _set(["float32"])
    manifest = build_manifest(params, rank=0, size=2, root=0, settings={})
    (group,) = param_groups(manifest.host_params, "avg")
    assert group.counts == [len(params[n]) for n in group.names] and not group.staged
    # one bucket holds names of 1, 2 and 3 replicas
    bucket = next(t for _, t, _ in plan_groups([group], 256).transfers if t[0])
    assert len(set(group.counts[bucket[1] : bucket[2]])) == 3


def test_staged_groups_plan_their_widened_bytes():
    from mpisync.allreduce.groups import param_groups
    from mpisync.params.manifest import build_manifest

    params = {"h": np.zeros(10, np.float16), "i": np.zeros(10, np.int16), "f": np.zeros(3)}
    manifest = build_manifest(params, rank=0, size=2, root=0, settings={})
    groups = {g.dtype: g for g in param_groups(manifest.host_params, "avg")}
    assert list(groups) == ["float64", "float16", "int16"]  # first appearance, in sorted order
    assert groups["float16"].rdtype == np.float32 and groups["float16"].sizes.tolist() == [40]
    assert groups["int16"].rdtype == np.int64 and groups["int16"].sizes.tolist() == [80]
    assert groups["float64"].replicas is None and groups["int16"].staged
    sums = {g.dtype: g for g in param_groups(manifest.host_params, "sum")}
    assert sums["int16"].rdtype == np.int16 and not sums["int16"].staged
