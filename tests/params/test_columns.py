"""Unit tests of mpisync.params.columns: the general manifest's host masters as columns post the
collectives build_plan posts with spans and aliases, and a compiled program fills every replica."""

import numpy as np
import pytest
from reference_plan import build_plan

from mpisync.params.layout import NO_RUNS
from mpisync.params.manifest import build_manifest
from mpisync.plan.transfers import bulk_plan


def _flat_set(rank: int):
    """Names over one flat buffer (a run end to end), a tied pair, a replica list, small ones."""
    flat = np.zeros(64, np.float32) if rank else np.arange(64, dtype=np.float32)
    tied = np.zeros(6, np.int32) if rank else np.arange(6, dtype=np.int32) + 100
    fill = 0 if rank else 1
    params = {
        "a.w": flat[:40],  # "a.w" then "a.b", end to end: one run of 256 bytes
        "a.b": flat[40:],
        "emb": tied,
        "head": tied,  # the same memory as "emb": travels once
        "rep": [np.full(5, fill, np.int16), np.zeros(5, np.int16), np.zeros(5, np.int16)],
        "s1": np.full(3, fill, np.uint8),
        "s2": np.full(0, fill, np.uint8),
        "z": np.full(300, fill, np.uint8),
    }
    return params, flat


def _columns(rank: int, fusion: int):
    params, flat = _flat_set(rank)
    manifest = build_manifest(params, rank=rank, size=2, root=0)
    layout = manifest.host_layout()
    return params, manifest, layout, manifest.host_columns(layout, fusion)


@pytest.mark.parametrize("fusion", [16, 64, 1 << 20])
def test_column_plan_is_the_per_parameter_plan_with_spans_and_aliases(fusion):
    _, manifest, layout, columns = _columns(0, fusion)
    assert layout.runs == ((1, 0),) and [a for a, _ in layout.aliases] == [3]  # "head" after "emb"
    sizes = [p.nbytes for p in manifest.host_params]
    sizes[3] = 0  # a one-replica alias travels with its representative
    expected = build_plan(sizes, fusion, 1 << 30, layout.runs)
    got = bulk_plan(columns.sizes, fusion, 1 << 30)
    assert [(t.fused, t.nbytes) for t in expected] == [(f, n) for f, _, _, n in got]
    if fusion <= 256:  # the run travels as one span, named by both members
        (span,) = [i for f, i, _, n in got if not f and n == 256]
        assert columns.label(span) == ("a.w", "a.b")  # in address order


@pytest.mark.parametrize("fusion", [16, 64, 1 << 20])
def test_compiled_programs_fill_every_replica_with_roots_bytes(fusion):
    from mpisync.plan.arena import Arena
    from mpisync.plan.program import compile_program

    root_params, _, _, send = _columns(0, fusion)
    params, _, _, recv = _columns(1, fusion)
    plan = bulk_plan(send.sizes, fusion, 1 << 30)
    assert plan == bulk_plan(recv.sizes, fusion, 1 << 30)
    nbytes = sum(1 for step in plan if step[0]) * fusion  # a slot per bucket
    arenas = [Arena(nbytes), Arena(nbytes)]
    sent = compile_program(send, plan, receiving=False, arena=arenas[0], fusion_bytes=fusion)
    got = compile_program(recv, plan, receiving=True, arena=arenas[1], fusion_bytes=fusion)
    for a, b in zip(sent, got):  # the "broadcast": root's step buffer into the receiver's
        a.start()
        b.buffer[0][:] = a.buffer[0]
        a.finish()
        b.finish()
    for name, value in root_params.items():
        expected = (value[0] if isinstance(value, list) else value).tobytes()
        for replicas in (value, params[name]):  # root's own replicas too
            for replica in replicas if isinstance(replicas, list) else [replicas]:
                assert replica.tobytes() == expected, name


def test_one_replica_per_name_has_no_fan_out():
    manifest = build_manifest({"a": np.zeros(3), "b": np.zeros(2)}, rank=1, size=2, root=0)
    columns = manifest.host_columns(NO_RUNS, 64)
    assert columns.fan_out(range(2)) == () and columns.spans == {}
