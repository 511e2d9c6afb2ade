"""Pure logic, no peers: the broadcast plan, settings resolution, error diagnosis, array adapters."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mpisync import InvalidParamError, ManifestMismatchError
from mpisync.agreement import diagnose
from mpisync.arrays import UnsupportedArray, as_array_view
from mpisync.config import resolve
from mpisync.plan import build_plan


def _covered(plan, sizes):
    seen = [np.zeros(n, np.int32) for n in sizes]
    for t in plan:
        assert t.nbytes == sum(p[3] for p in t.pieces)
        for index, start, offset, n in t.pieces:
            seen[index][start:start + n] += 1
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
    assert [(t.fused, t.pieces) for t in plan] == [(False, ((0, 0, 0, 4),)), (False, ((2, 0, 0, 8),))]
    assert plan[1].completes == (1, 2)


def test_settings_sources(monkeypatch):
    monkeypatch.delenv("MPISYNC_MAX_CONCURRENT", raising=False)
    monkeypatch.setenv("MPISYNC_FUSION_BYTES", "4096")
    monkeypatch.setenv("MPISYNC_TIMEOUT", "none")
    s = resolve(max_concurrent=None, fusion_bytes=None, gpu_transport="STAGED")
    assert (s.max_concurrent.source, s.fusion_bytes.value, s.fusion_bytes.source) == ("built-in", 4096, "environment")
    assert (s.gpu_transport.value, s.gpu_transport.source) == ("staged", "argument")
    assert s.timeout.value is None
    assert resolve(fusion_bytes=7).fusion_bytes.value == 7
    monkeypatch.setenv("MPISYNC_MAX_CONCURRENT", "zero")
    with pytest.raises(InvalidParamError, match="MPISYNC_MAX_CONCURRENT"):
        resolve()
    with pytest.raises(InvalidParamError, match="gpu_transport"):
        resolve(max_concurrent=1, gpu_transport="carrier-pigeon")


def _doc(params, errors=(), root=0, **settings):
    return {"settings": {"root": root, **settings}, "params": params, "errors": list(errors)}


def test_diagnose_prefers_invalid_input_and_lists_every_rank():
    docs = [_doc([["a", [2], "float32", 1, "host"]]), _doc([], [["a", "not C-contiguous"]]), _doc([], [[None, "bad root"]])]
    err = diagnose(docs)
    assert isinstance(err, InvalidParamError)
    assert str(err) == ("mpisync: invalid input on rank(s) 1, 2: rank 1: parameter 'a': not C-contiguous; "
                        "rank 2: bad root")


def test_diagnose_names_mismatches_against_root():
    row = ["a", [2, 3], "float32", 1, "host"]
    docs = [_doc([row, ["b", [1], "int8", 1, "host"]], root=1), _doc([row], root=1),
            _doc([["a", [3, 2], "float64", 2, "device"]], root=1)]
    err = diagnose(docs)
    assert isinstance(err, ManifestMismatchError)
    text = str(err)
    assert text.startswith("mpisync: parameters differ from root rank 1's on rank(s) 0, 2: ")
    assert "rank 0: parameter 'b' is not on root rank 1" in text
    assert "rank 2: parameter 'a' has shape (3, 2), root has (2, 3)" in text
    assert "rank 2: parameter 'a' has dtype float64, root has float32" in text
    assert "rank 2: parameter 'a' has 2 replica(s), root has 1" in text
    assert "rank 2: parameter 'a' is in device memory, on root in host memory" in text


def test_diagnose_long_lists_are_cut():
    docs = [_doc([[f"p{i}", [1], "int8", 1, "host"] for i in range(50)]), _doc([])]
    assert str(diagnose(docs)).endswith("; ... and 30 more")


def test_array_views_alias_memory_and_name_dtypes_alike():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = as_array_view(a)
    view.data[:4] = bytes(4)  # a memoryview of the same memory
    assert a[0, 0] == 0 and view.shape == (2, 3) and view.dtype == "float32" and view.nbytes == 24
    assert as_array_view(np.zeros(3, ">f4")).dtype == ">float32"
    assert as_array_view(np.float64(3.0).reshape(())).shape == ()
    with pytest.raises(UnsupportedArray, match="unsupported object"):
        as_array_view(object())
    torch = pytest.importorskip("torch")
    assert as_array_view(torch.zeros(2, dtype=torch.float32)).dtype == "float32"
    assert as_array_view(torch.zeros((), dtype=torch.bfloat16)).nbytes == 2


_ARENA_PATHS = {"compiled": {}, "vectored": {"compiled": False}, "loop": {"compiled": False, "vectored": False}}


def _speedups_or_skip():
    """The C loops module; the test is skipped where it is not built (or MPISYNC_SPEEDUPS=0)."""
    from mpisync.speedups import speedups

    if speedups is None:
        pytest.skip("mpisync._speedups is not built here (or MPISYNC_SPEEDUPS=0)")
    return speedups


def _arena_path(path):
    if path == "compiled":
        _speedups_or_skip()
    return _ARENA_PATHS[path]


@pytest.mark.parametrize("path", list(_ARENA_PATHS))
def test_arena_gather_then_scatter_round_trips_more_buffers_than_one_system_call_takes(path):
    from mpisync.arena import Arena, copy_list

    arena = Arena(1 << 16, **_arena_path(path))
    if path == "vectored":
        assert arena.vectored == hasattr(__import__("os"), "memfd_create")
    sources = [np.full(n, i % 251, np.uint8) for i, n in enumerate([3, 0, 1, 17] * 700)]  # 2100 non-empty
    copies = copy_list(100, [memoryview(a) for a in sources])
    assert sum(len(group) for _, group, _, _ in copies) == 2100 and len(copies) >= 3
    arena.view[:100] = b"\xab" * 100
    arena.gather(copies)
    expected = np.concatenate(sources)
    assert bytes(arena.view[100:100 + expected.size]) == expected.tobytes()
    assert bytes(arena.view[:100]) == b"\xab" * 100  # nothing written before the offset
    targets = [np.zeros_like(a) for a in sources]
    arena.scatter(copy_list(100, [memoryview(a) for a in targets]))
    for a, b in zip(sources, targets):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("path", list(_ARENA_PATHS))
def test_compiled_bucket_fills_masters_and_every_replica_from_the_arena(path):
    from mpisync.arena import Arena
    from mpisync.manifest import build_manifest
    from mpisync.program import compile_program

    counts = [1, 3, 2, 3, 1, 2]  # replica runs break and restart inside one bucket
    params = {f"p{i}": [np.zeros(5 + i, np.int16) for _ in range(c)] for i, c in enumerate(counts)}
    manifest = build_manifest(params, rank=1, size=2, root=0)
    host = manifest.host_params
    plan = build_plan([p.nbytes for p in host], 1 << 10)
    assert len(plan) == 1 and plan[0].fused
    arena = Arena(1 << 10, **_arena_path(path))
    (step,) = compile_program(host, plan, receiving=True, arena=arena, fusion_bytes=1 << 10)
    assert step.pack == ()
    arena.view[:plan[0].nbytes] = np.arange(plan[0].nbytes, dtype=np.uint8).tobytes()
    step.finish()
    for param, (_, _, offset, n) in zip(host, plan[0].pieces):
        for replica in param.replicas:
            assert bytes(replica.data) == bytes(range(offset, offset + n))


def test_buffer_list_copies_within_the_arena_and_refuses_what_would_not_fit():
    speedups = _speedups_or_skip()
    sources = [np.arange(n, dtype=np.uint8) + n for n in (5, 0, 3)]
    held = speedups.BufferList([memoryview(a) for a in sources])
    assert len(held) == 3 and held.nbytes == 8
    arena = bytearray(12)
    assert held.gather(arena, 2) == 8
    assert bytes(arena) == bytes([0, 0, 5, 6, 7, 8, 9, 3, 4, 5, 0, 0])
    with pytest.raises(ValueError, match="do not fit"):
        held.gather(arena, 5)  # 8 bytes from offset 5 of 12
    with pytest.raises(ValueError, match="do not fit"):
        held.gather(arena, -1)
    frozen = np.zeros(4, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        speedups.BufferList([frozen]).scatter(bytes(4))
    assert not frozen.any()
    with pytest.raises((ValueError, BufferError)):
        speedups.BufferList([np.zeros((3, 3))[:, 0]])  # not contiguous
    targets = [np.zeros(n, np.uint8) for n in (5, 0, 3)]
    speedups.BufferList(targets).scatter(bytes(arena), 2)
    assert [t.tolist() for t in targets] == [s.tolist() for s in sources]


def test_buffer_list_streaming_gather_gives_the_same_bytes_at_every_alignment():
    speedups = _speedups_or_skip()
    rng = np.random.default_rng(5)
    sources = [rng.integers(0, 256, n, dtype=np.uint8) for n in (1, 15, 16, 17, 63, 64, 65, 400, 1000, 0, 3, 4096)]
    packed = np.concatenate(sources)
    held = speedups.BufferList(sources)
    for offset in range(40):
        expected = np.full(8192, 7, np.uint8)
        expected[offset:offset + packed.size] = packed
        for streaming in (False, True):
            arena = np.full(8192, 7, np.uint8)
            assert held.gather(arena, offset, streaming) == packed.size
            assert arena.tobytes() == expected.tobytes(), (offset, streaming)
    with pytest.raises(ValueError):
        held.gather(np.zeros(packed.size, np.uint8), 1, True)  # one byte short: refused, nothing written


def test_same_items_is_identity_of_keys_and_values_in_order():
    speedups = _speedups_or_skip()
    a, b = np.zeros(1), np.zeros(1)
    params = {"a": a, "b": b}
    assert speedups.same_items(params, ("a", "b"), (a, b))
    assert not speedups.same_items(params, ("b", "a"), (b, a))  # insertion order differs
    assert not speedups.same_items(params, ("a", "b"), (a, np.zeros(1)))  # equal values, another array
    assert not speedups.same_items(params, ("a",), (a,))
    assert not speedups.same_items({"a": a, "b": b, "c": a}, ("a", "b"), (a, b))


def test_dict_version_changes_with_every_change_and_differs_between_dicts():
    speedups = _speedups_or_skip()
    a = np.zeros(1)
    params = {"a": a}
    version = speedups.dict_version(params)
    if version == -1:
        pytest.skip("no dict version tag in this Python (3.12 on): same_items alone decides")
    params["a"] = a  # the same object again: nothing changed
    assert speedups.dict_version(params) == version
    params["a"] = np.zeros(1)
    changed = speedups.dict_version(params)
    assert changed != version
    params["a"] = a  # back to the first array: still a new version
    assert speedups.dict_version(params) not in (version, changed)
    assert speedups.dict_version({"a": a}) != speedups.dict_version({"a": a})
    with pytest.raises(TypeError):
        speedups.dict_version([])


def test_fused_buckets_take_two_slots_on_one_node_and_one_per_collective_across_nodes():
    from mpisync.program import FUSED_SLOTS, fused_slots

    assert FUSED_SLOTS == 2
    assert [fused_slots(16, n, True) for n in (1, 2, 13)] == [1, 2, 2]
    assert [fused_slots(16, n, False) for n in (1, 2, 13, 40)] == [1, 2, 13, 16]
    assert fused_slots(1, 13, True) == fused_slots(1, 13, False) == 1


def test_shared_memory_setting_is_every_set_never_or_small_sets(monkeypatch):
    from mpisync import intranode

    for raw, expected in (("1", True), ("on", True), ("0", False), ("off", False), ("", None), (" ", None)):
        monkeypatch.setenv("MPISYNC_SHARED_MEMORY", raw)
        assert intranode.setting() is expected, raw
    monkeypatch.delenv("MPISYNC_SHARED_MEMORY")
    assert intranode.setting() is None and not intranode.enabled()


def test_all_smaller_than_fusion_bytes_on_both_manifests():
    from mpisync.bulk import scan
    from mpisync.manifest import build_manifest
    from mpisync.prepared import all_smaller

    for arrays, expected in (({"a": np.zeros(10), "b": np.zeros(127, np.uint8)}, True),
                             ({"a": np.zeros(10), "b": np.zeros(128, np.uint8)}, False),
                             ({}, False)):
        general = build_manifest(arrays, rank=0, size=2, root=0, settings={})
        assert all_smaller(general, 128) is expected
        bulk = scan(arrays, rank=0, size=2, root=0, devices=None, settings={})
        if bulk is not None:
            assert all_smaller(bulk, 128) is expected


def test_cross_memory_byte_ranges_cut_pieces_at_the_share():
    from mpisync.crossmemory import _byte_range

    local = np.array([(100, 10), (200, 5), (300, 20)], dtype=np.int64)
    remote = np.array([(1000, 10), (2000, 5), (3000, 20)], dtype=np.int64)
    assert _byte_range(local, remote, 8, 17) == [(108, 1008, 2), (200, 2000, 5), (300, 3000, 2)]
    whole = _byte_range(local, remote, 0, 35)
    assert whole == [(100, 1000, 10), (200, 2000, 5), (300, 3000, 20)]
    assert _byte_range(local, remote, 0, 0) == [] and _byte_range(local, remote, 35, 35) == []
    split = _byte_range(local, remote, 0, 12) + _byte_range(local, remote, 12, 35)
    assert sum(n for _, _, n in split) == 35  # root's share and the receiver's rest cover every byte once


def test_cross_memory_regions_read_gaps_under_a_page_into_scratch():
    from mpisync.crossmemory import _batches, _regions

    # remote (root) pieces out of order, one of them empty; local (receiver) addresses anywhere
    remote = np.array([(1100, 50), (1000, 100), (1150, 0), (1200, 10), (9000, 8)], dtype=np.int64)
    local = np.array([(50_000, 50), (60_000, 100), (70_000, 0), (80_000, 10), (90_000, 8)], dtype=np.int64)
    pairs = _regions(local, remote, scratch=7)
    assert pairs == [(60_000, 1000, 100), (50_000, 1100, 50), (7, 1150, 50), (80_000, 1200, 10), (90_000, 9000, 8)]
    (_, _, _, nlocal, remote_iov, nremote, nbytes), = _batches(None, 0, pairs)
    # 1000..1210 is one remote range (a gap of 50 bytes read into scratch); 9000 is past a page: its own
    assert (nlocal, nremote, nbytes) == (5, 2, 218)
    assert [(remote_iov[i].base, remote_iov[i].len) for i in range(nremote)] == [(1000, 210), (9000, 8)]


def test_attribute_runs_merges_consecutive_identical_values():
    speedups = _speedups_or_skip()
    f4, f8 = np.dtype("float32"), np.dtype("float64")
    arrays = [np.zeros(1, f4), np.zeros(2, f4), np.zeros(1, f8), np.zeros(3, f4)]
    assert speedups.attribute_runs(arrays, "dtype") == [[f4, 2], [f8, 1], [f4, 1]]
    assert speedups.attribute_runs([], "dtype") == []
    with pytest.raises(AttributeError):
        speedups.attribute_runs([np.zeros(1), 3], "dtype")


@given(st.lists(st.sampled_from([0, 1, 3, 7, 8, 9, 15, 16, 17, 40, 100]), max_size=40),
       st.sampled_from([0, 1, 8, 16, 17, 64]), st.sampled_from([1, 5, 16, 1 << 30]))
@settings(max_examples=300, deadline=None)
def test_bulk_plan_posts_the_collectives_build_plan_does(sizes, fusion, chunk):
    from mpisync.bulk import bulk_plan

    expected = build_plan(sizes, fusion, chunk)
    got = bulk_plan(np.array(sizes, dtype=np.int64), fusion, chunk)
    assert [(t.fused, t.nbytes) for t in expected] == [(f, n) for f, _, _, n in got]
    for t, (fused, first, last, nbytes) in zip(expected, got):
        if fused:  # the same tensors, in the same order (empty ones carry nothing)
            assert [p[0] for p in t.pieces] == [i for i in range(first, last) if sizes[i]]
        else:
            assert t.pieces[0][:2] == (first, last)


def _scan(params, rank=1, size=2, root=0, **settings):
    from mpisync.bulk import scan

    return scan(params, rank=rank, size=size, root=root, devices=None, settings=settings)


def test_bulk_scan_gives_the_full_manifests_digest():
    from mpisync.bulk import BulkManifest
    from mpisync.manifest import build_manifest

    _speedups_or_skip()
    cases = [
        {f"w{i:03d}": np.zeros(i % 5 + 1, np.float32) for i in range(50)},
        {"b": np.zeros((2, 3), ">i4"), "a": np.ones((), np.complex64), "c": np.zeros((0, 4), np.float16),
         "d": np.zeros(3, np.float16), "e": np.zeros(3, np.float32), "f": np.zeros(3, np.float32)},
        {"z": np.zeros(3, np.bool_), "y": np.zeros(3, [("a", "<i2"), ("b", "<f4")])},
    ]
    for params in cases:
        for rank in (0, 1):
            bulk = _scan(params, rank=rank, fusion_bytes=64)
            full = build_manifest(params, rank=rank, size=2, root=0, settings={"fusion_bytes": 64})
            assert isinstance(bulk, BulkManifest)
            assert bulk.digest() == full.digest() and bulk.settings == full.settings
            assert bulk.names == full.names and bulk.nbytes == full.nbytes and bulk.tensors == full.tensors
            assert bulk.sizes.tolist() == [p.nbytes for p in full.params]
            assert bulk.encode() == full.encode()
    base = cases[0]
    for changed in ({**base, "w001": np.zeros(3, np.float64)}, {**base, "w001": np.zeros((1, 2), np.float32)},
                    {k if k != "w001" else "w001x": v for k, v in base.items()}):
        assert _scan(changed).digest() != _scan(base).digest()


def test_bulk_scan_leaves_everything_but_plain_numpy_to_the_full_manifest():
    import collections

    _speedups_or_skip()
    plain = {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}
    assert _scan(plain) is not None
    frozen = np.zeros(4, np.float32)
    frozen.flags.writeable = False
    one = np.zeros(8, np.float32)

    class Subclass(np.ndarray):
        pass

    refused = {
        "replica list": {**plain, "c": [np.zeros(2), np.zeros(2)]},
        "view end to end with another": {"a": one[:4], "b": one[4:]},
        "read-only on a receiver": {**plain, "c": frozen},
        "object dtype": {**plain, "c": np.array([None, 1])},
        "not contiguous": {**plain, "c": np.zeros((4, 4))[:, 1]},
        "a subclass": {**plain, "c": np.zeros(3).view(Subclass)},
        "names not all str": {**plain, 3: np.zeros(2)},
        "bytes object": {**plain, "c": b"abcd"},
        "empty": {},
    }
    for why, params in refused.items():
        assert _scan(params) is None, why
    assert _scan({**plain, "c": frozen}, rank=0) is not None  # root only reads
    assert _scan(collections.OrderedDict(plain)) is not None  # a torch state_dict() is one

    class Lookups(dict):
        pass

    assert _scan(Lookups(plain)) is None  # a subclass may override lookups
    assert _scan(plain, size=1, rank=0) is None and _scan(plain, root=2) is None
    from mpisync.bulk import scan

    assert scan(plain, rank=1, size=2, root=0, devices=["cpu"], settings={}) is None
    try:
        import torch
    except ImportError:
        return
    assert _scan({**plain, "c": torch.zeros(2)}) is None


def test_bulk_steps_pack_and_unpack_every_tensor_through_the_arena():
    from mpisync.arena import Arena
    from mpisync.bulk import bulk_plan, compile_bulk

    _speedups_or_skip()
    sizes = [3, 0, 10, 40, 7, 7, 0, 2]
    root = {f"p{i}": np.arange(n, dtype=np.uint8) + 10 * i for i, n in enumerate(sizes)}
    receiver = {name: np.zeros_like(a) for name, a in root.items()}
    send, recv = _scan(root, rank=0), _scan(receiver, rank=1)
    plan = bulk_plan(send.sizes, 16, 1 << 30)
    assert [(f, n) for f, _, _, n in plan] == [(True, 13), (False, 40), (True, 16)]
    arenas = [Arena(32, vectored=False), Arena(32, vectored=False)]
    sent = compile_bulk(send, plan, receiving=False, arena=arenas[0], fusion_bytes=16)
    got = compile_bulk(recv, plan, receiving=True, arena=arenas[1], fusion_bytes=16)
    for a, b in zip(sent, got):  # the "broadcast": root's step buffer into the receiver's
        a.start()
        b.buffer[0][:] = a.buffer[0]
        b.finish()
    for name in root:
        assert receiver[name].tobytes() == root[name].tobytes(), name
    with pytest.raises(ValueError, match="_speedups"):
        compile_bulk(send, plan, receiving=False, arena=Arena(32, compiled=False), fusion_bytes=16)


def test_bulk_scan_takes_torch_cpu_tensors_with_the_full_manifests_digest():
    _speedups_or_skip()
    torch = pytest.importorskip("torch")
    from mpisync.bulk import BulkManifest
    from mpisync.manifest import build_manifest

    weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))  # requires grad
    params = {"b": torch.zeros(3, dtype=torch.int64), "a": torch.ones((), dtype=torch.complex64),
              "c": torch.zeros((0, 4), dtype=torch.float16), "w": weight, "flag": torch.zeros(2, dtype=torch.bool)}
    as_numpy = {name: t.detach().numpy() for name, t in params.items()}
    for rank in (0, 1):
        bulk = _scan(params, rank=rank, fusion_bytes=64)
        full = build_manifest(params, rank=rank, size=2, root=0, settings={"fusion_bytes": 64})
        assert isinstance(bulk, BulkManifest) and bulk.through_torch
        assert bulk.digest() == full.digest() == _scan(as_numpy, rank=rank, fusion_bytes=64).digest()
        assert bulk.sizes.tolist() == [p.nbytes for p in full.params]
        # The bulk path's buffers are the tensors' own memory: no copy.
        assert bulk.values[bulk.names.index("w")].ctypes.data == weight.data_ptr()


def test_bulk_scan_leaves_torch_tensors_numpy_cannot_view_to_the_full_manifest():
    _speedups_or_skip()
    torch = pytest.importorskip("torch")
    plain = {"a": torch.zeros(4), "b": torch.zeros(4)}
    assert _scan(plain) is not None
    refused = {
        "bfloat16 (numpy lacks it)": {**plain, "c": torch.zeros(2, dtype=torch.bfloat16)},
        "not contiguous": {**plain, "c": torch.zeros(4, 4).t()},
        "lazy conjugate": {**plain, "c": torch.zeros(2, dtype=torch.complex64).conj()},
        "lazy negative": {**plain, "c": torch._neg_view(torch.zeros(2, dtype=torch.complex64))},
        "sparse": {**plain, "c": torch.zeros(2, 2).to_sparse()},
        "mixed with numpy": {**plain, "c": np.zeros(4, np.float32)},
        "numpy first, then torch": {"0": np.zeros(4, np.float32), **plain},
        "views end to end": (lambda one: {"a": one[:4], "b": one[4:]})(torch.zeros(8)),
    }
    for why, params in refused.items():
        assert _scan(params) is None, why
