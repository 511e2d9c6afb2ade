"""Unit tests of mpisync.params.bulk: scan (the bulk manifest and what it leaves to the full one)
and compiled bulk steps."""

import numpy as np
import pytest

from unitutil import LOOP_FORMS, loops_of


@pytest.fixture(autouse=True, params=LOOP_FORMS)
def loops(request, monkeypatch):
    """Every test runs with the C loops (where built) and with their Python form."""
    from mpisync.params import bulk

    chosen = loops_of(request.param)
    monkeypatch.setattr(bulk, "loops", chosen)
    return chosen


def _scan(params, rank=1, size=2, root=0, **settings):
    from mpisync.params.bulk import scan

    return scan(params, rank=rank, size=size, root=root, devices=None, settings=settings)


def test_verification_digests_of_a_bulk_set_are_the_full_manifests():
    """Ranks verifying on either path compare the same rows: each master's digest, then 1."""
    from mpisync.params.manifest import build_manifest
    from mpisync.params.verify import param_digests

    params = {
        "b": np.arange(6, dtype=">i4").reshape(2, 3),
        "a": np.ones((), np.complex64),
        "c": np.zeros((0, 4), np.float16),
        "y": np.zeros(3, [("a", "<i2"), ("b", "<f4")]),
        **{f"w{i:03d}": np.full(i % 5 + 1, i, np.float32) for i in range(40)},
    }
    bulk = _scan(params)
    rows = param_digests(bulk)
    assert np.array_equal(rows, param_digests(build_manifest(params, rank=1, size=2, root=0)))
    assert rows[:, 2].tolist() == [1] * len(params)
    params["w007"][0] += 1
    changed = param_digests(_scan(params))
    differs = (changed[:, :2] != rows[:, :2]).any(axis=1)
    assert [bulk.names[i] for i in np.flatnonzero(differs)] == ["w007"]


def test_bulk_scan_gives_the_full_manifests_digest():
    from mpisync.params.bulk import BulkManifest
    from mpisync.params.manifest import build_manifest

    cases = [
        {f"w{i:03d}": np.zeros(i % 5 + 1, np.float32) for i in range(50)},
        {
            "b": np.zeros((2, 3), ">i4"),
            "a": np.ones((), np.complex64),
            "c": np.zeros((0, 4), np.float16),
            "d": np.zeros(3, np.float16),
            "e": np.zeros(3, np.float32),
            "f": np.zeros(3, np.float32),
        },
        {"z": np.zeros(3, np.bool_), "y": np.zeros(3, [("a", "<i2"), ("b", "<f4")])},
    ]
    for params in cases:
        for rank in (0, 1):
            bulk = _scan(params, rank=rank, fusion_bytes=64)
            full = build_manifest(params, rank=rank, size=2, root=0, settings={"fusion_bytes": 64})
            assert isinstance(bulk, BulkManifest)
            assert bulk.digest() == full.digest() and bulk.settings == full.settings
            assert (
                bulk.names == full.names
                and bulk.nbytes == full.nbytes
                and bulk.tensors == full.tensors
            )
            assert bulk.sizes.tolist() == [p.nbytes for p in full.params]
            assert bulk.encode() == full.encode()
    base = cases[0]
    for changed in (
        {**base, "w001": np.zeros(3, np.float64)},
        {**base, "w001": np.zeros((1, 2), np.float32)},
        {k if k != "w001" else "w001x": v for k, v in base.items()},
    ):
        assert _scan(changed).digest() != _scan(base).digest()


def test_bulk_scan_leaves_everything_but_plain_numpy_to_the_full_manifest():
    import collections

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
    assert _scan(plain, root=2) is None
    # one rank: the set is checked, nothing is copied
    assert _scan(plain, size=1, rank=0) is not None
    from mpisync.params.bulk import scan

    assert scan(plain, rank=1, size=2, root=0, devices=["cpu"], settings={}) is None
    try:
        import torch
    except ImportError:
        return
    assert _scan({**plain, "c": torch.zeros(2)}) is None


def test_bulk_steps_pack_and_unpack_every_tensor_through_the_arena():
    from mpisync.params.layout import NO_RUNS
    from mpisync.plan.arena import Arena
    from mpisync.plan.program import compile_program
    from mpisync.plan.transfers import bulk_plan

    sizes = [3, 0, 10, 40, 7, 7, 0, 2]
    root = {f"p{i}": np.arange(n, dtype=np.uint8) + 10 * i for i, n in enumerate(sizes)}
    receiver = {name: np.zeros_like(a) for name, a in root.items()}
    send, recv = _scan(root, rank=0), _scan(receiver, rank=1)
    plan = bulk_plan(send.sizes, 16, 1 << 30)
    assert [(f, n) for f, _, _, n in plan] == [(True, 13), (False, 40), (True, 16)]
    arenas = [Arena(32, vectored=False), Arena(32, vectored=False)]
    send, recv = send.host_columns(NO_RUNS, 16), recv.host_columns(NO_RUNS, 16)
    sent = compile_program(send, plan, receiving=False, arena=arenas[0], fusion_bytes=16)
    got = compile_program(recv, plan, receiving=True, arena=arenas[1], fusion_bytes=16)
    for a, b in zip(sent, got):  # the "broadcast": root's step buffer into the receiver's
        a.start()
        b.buffer[0][:] = a.buffer[0]
        b.finish()
    for name in root:
        assert receiver[name].tobytes() == root[name].tobytes(), name
    if getattr(send.held, "compiled", False):  # C lists: only an arena with the C loops copies them
        with pytest.raises(ValueError, match="C buffer lists"):
            compile_program(
                send, plan, receiving=False, arena=Arena(32, compiled=False), fusion_bytes=16
            )


def test_bulk_scan_takes_torch_cpu_tensors_with_the_full_manifests_digest():
    torch = pytest.importorskip("torch")
    from mpisync.params.bulk import BulkManifest
    from mpisync.params.manifest import build_manifest

    weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))  # requires grad
    params = {
        "b": torch.zeros(3, dtype=torch.int64),
        "a": torch.ones((), dtype=torch.complex64),
        "c": torch.zeros((0, 4), dtype=torch.float16),
        "w": weight,
        "flag": torch.zeros(2, dtype=torch.bool),
    }
    as_numpy = {name: t.detach().numpy() for name, t in params.items()}
    for rank in (0, 1):
        bulk = _scan(params, rank=rank, fusion_bytes=64)
        full = build_manifest(params, rank=rank, size=2, root=0, settings={"fusion_bytes": 64})
        assert isinstance(bulk, BulkManifest) and bulk.through_torch
        assert (
            bulk.digest() == full.digest() == _scan(as_numpy, rank=rank, fusion_bytes=64).digest()
        )
        assert bulk.sizes.tolist() == [p.nbytes for p in full.params]
        # The bulk path's buffers are the tensors' own memory: no copy.
        assert bulk.values[bulk.names.index("w")].ctypes.data == weight.data_ptr()


def test_bulk_scan_leaves_torch_tensors_numpy_cannot_view_to_the_full_manifest():
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


def test_bulk_scan_reads_the_re_checked_states_when_the_dict_is_in_sorted_order(loops):
    values = {f"p{i}": np.full(i + 1, i, np.float32) for i in range(5)}
    manifest = _scan(values)
    assert manifest.states == loops.array_states(list(values.values()), np.ndarray)
    shuffled = {k: values[k] for k in ["p3", "p0", "p4", "p1", "p2"]}
    assert _scan(shuffled).states is None  # the re-check compares in the dict's order: read again
    # names must be str: the general path says so
    assert _scan({1: np.zeros(2), 2: np.zeros(2)}) is None


def test_bulk_scan_pairs_names_and_arrays_of_a_reordered_ordered_dict():
    # An OrderedDict's iteration order can differ from the dict's beneath it (move_to_end): the
    # scan must pair each name with its own array whatever the order.
    import collections

    params = collections.OrderedDict((f"p{i}", np.full(i + 1, i, np.float32)) for i in range(4))
    params.move_to_end("p0")
    manifest = _scan(params)
    assert manifest.names == ["p0", "p1", "p2", "p3"]
    assert all(manifest.values[i] is params[name] for i, name in enumerate(manifest.names))
    assert manifest.states is None


def test_shares_or_touches_agrees_with_every_pair_compared():
    """The sorted check against the definition (some two non-empty regions overlap or meet), on
    300 random layouts, a third of them in address order."""
    from mpisync.params.bulk import shares_or_touches

    for seed in range(300):
        rng = np.random.default_rng(seed)
        count = int(rng.integers(0, 12))
        starts = rng.integers(0, 60, count) if seed % 3 else np.cumsum(rng.integers(0, 9, count))
        sizes = rng.integers(0, 8, count)
        expected = any(
            sizes[i]
            and sizes[j]
            and starts[i] <= starts[j] + sizes[j]
            and starts[j] <= starts[i] + sizes[i]
            for i in range(count)
            for j in range(i + 1, count)
        )
        lengths, addresses = sizes.astype(np.int64).tobytes(), starts.astype(np.int64).tobytes()
        assert shares_or_touches(lengths, addresses) == expected, (starts.tolist(), sizes.tolist())
