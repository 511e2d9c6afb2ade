"""Unit tests of mpisync.allreduce.bulk: which sets take the bulk adapter, and that its groups give
the steps the general adapter's give (mpisync.allreduce.groups), through the one plan."""

import collections
import random

import numpy as np
import pytest

from unitutil import LOOP_FORMS, loops_of


@pytest.fixture(autouse=True, params=LOOP_FORMS)
def loops(request, monkeypatch):
    """Every test runs with the C loops (where built) and with their Python form."""
    from mpisync.allreduce import bulk as reduce_bulk
    from mpisync.params import bulk

    chosen = loops_of(request.param)
    monkeypatch.setattr(bulk, "loops", chosen)
    monkeypatch.setattr(reduce_bulk, "loops", chosen)
    return chosen


_SETTINGS = {"op": "sum", "fusion_bytes": 256}


def _scan(params, op="sum", rank=0, size=2, devices=None):
    from mpisync.allreduce.bulk import scan_for_reduce

    return scan_for_reduce(
        params, op, rank=rank, size=size, devices=devices, settings=dict(_SETTINGS, op=op)
    )


def test_sets_of_dtypes_mpi_reduces_as_they_are_take_the_bulk_path():
    ok = {f"g{i:02d}": np.zeros(i % 7, np.float32) for i in range(20)}
    assert _scan(ok) is not None and _scan(ok, "max", rank=1) is not None
    assert _scan({"a": np.zeros(3, np.int32)}, "avg") is None  # narrow integers: summed in int64
    assert _scan({"a": np.zeros(3, np.int64)}, "avg") is not None
    assert _scan({"a": np.zeros(3, np.float16)}) is None  # reduced in float32
    assert _scan({"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float64)}) is not None
    assert _scan({"a": np.zeros(3, np.float32), "b": np.zeros(3, np.float16)}) is None
    # refused: the general path says why
    assert _scan({"a": np.zeros(3, np.complex64)}, "max") is None
    assert _scan({"a": np.zeros(3, ">f4")}) is None
    assert _scan({"a": np.zeros(3, np.bool_)}) is None
    readonly = np.zeros(3, np.float32)
    readonly.flags.writeable = False
    assert _scan({"a": readonly}, rank=0) is None  # every rank writes, root included
    assert _scan({"a": [np.zeros(3, np.float32)] * 2}) is None
    assert _scan(ok, size=1) is not None and _scan(ok, devices=["cpu"]) is None
    assert _scan(ok, op=np.add) is None


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "mixed"])
def test_bulk_groups_give_the_general_adapters_steps(op, dtype):
    from mpisync.allreduce.bulk import bulk_groups
    from mpisync.allreduce.groups import param_groups
    from mpisync.allreduce.plan import compile_steps
    from mpisync.params.manifest import build_manifest

    rng = random.Random(f"{op}{dtype}")
    for trial in range(20):
        sizes = [
            rng.choice([0, 1, 3, 40, 64, 65, 200, 300, 1000]) for _ in range(rng.randint(1, 30))
        ]
        kinds = [
            rng.choice(["float32", "int64", "float64"]) if dtype == "mixed" else dtype
            for _ in sizes
        ]
        items = [
            (f"t{i:03d}", (np.arange(n) % 5 + i).astype(kinds[i])) for i, n in enumerate(sizes)
        ]
        if trial % 2:  # an OrderedDict out of sorted order (what a state_dict may be)
            rng.shuffle(items)
        params = (collections.OrderedDict if trial % 2 else dict)(items)
        fusion = rng.choice([0, 64, 256, 1024])
        bulk = _scan(params, op)
        if bulk is None:  # uint8 avg: the general path alone
            assert op == "avg" and dtype == "uint8"
            return
        full = build_manifest(params, rank=0, size=2, root=0, settings=dict(_SETTINGS, op=op))
        assert bulk.digest() == full.digest()
        got, got_arena = compile_steps(bulk_groups(bulk, op), op, fusion, 2)
        want, want_arena = compile_steps(param_groups(full.host_params, op), op, fusion, 2)
        assert len(got_arena) == len(want_arena), (sizes, fusion)

        # a bulk bucket's label also names the empty arrays within it
        def shown(steps, params=params):
            return [
                (
                    s.fused,
                    s.buffer.dtype,
                    s.buffer.size,
                    tuple(n for n in s.label if params[n].size),
                )
                for s in steps
            ]

        assert shown(got) == shown(want), (sizes, fusion)
        for g, w in zip(got, want):
            if g.fused:  # the same place in the arena, and the same bytes packed into it
                assert (
                    g.buffer.ctypes.data - np.frombuffer(got_arena.view, np.uint8).ctypes.data
                    == w.buffer.ctypes.data - np.frombuffer(want_arena.view, np.uint8).ctypes.data
                )
                g.load()
                w.load()
                assert g.buffer.tobytes() == w.buffer.tobytes()
            else:  # the array's own memory
                assert g.buffer.ctypes.data == w.buffer.ctypes.data
        for s in got:  # as if reduced; store() divides for avg, and unpacks a bucket
            s.buffer[...] = 2
            if s.store is not None:
                s.store()
        for s in got:
            for name in s.label:
                expected = np.full(params[name].size, 1 if op == "avg" else 2, params[name].dtype)
                assert params[name].tobytes() == expected.tobytes(), name


def test_torch_cpu_tensors_take_the_bulk_path_through_their_numpy_views():
    torch = pytest.importorskip("torch")
    from mpisync.allreduce.bulk import bulk_groups
    from mpisync.allreduce.groups import param_groups
    from mpisync.allreduce.plan import compile_steps
    from mpisync.params.manifest import build_manifest

    grads = collections.OrderedDict(
        (f"w{i}", torch.full((i * 30 + 1,), float(i))) for i in (3, 1, 2, 0)
    )
    bulk = _scan(grads, "avg")
    full = build_manifest(grads, rank=0, size=2, root=0, settings=dict(_SETTINGS, op="avg"))
    assert bulk is not None and bulk.digest() == full.digest()
    got, _ = compile_steps(bulk_groups(bulk, "avg"), "avg", 256, 2)
    want, _ = compile_steps(param_groups(full.host_params, "avg"), "avg", 256, 2)
    assert [(s.fused, s.buffer.size, s.label) for s in got] == [
        (s.fused, s.buffer.size, s.label) for s in want
    ]
    for s in got:
        if s.load is not None:
            s.load()
        s.buffer *= 2  # as if summed over two ranks holding the same values
        s.store()
    assert all(
        torch.equal(t, torch.full(t.shape, float(i)))
        for i, t in ((int(n[1:]), t) for n, t in grads.items())
    )
