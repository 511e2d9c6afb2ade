"""sync_params on host arrays: every replica on every rank ends with root's bytes."""

import numpy as np
import pytest
from mpi4py import MPI

import mpisync

from mpiutil import everyone, need_ranks, same_bytes, values

pytestmark = pytest.mark.mpi

DTYPES = [
    "float16",
    "float32",
    "float64",
    "bool",
    "complex64",
    "complex128",
    "uint16",
    "int8",
    "int64",
    "uint8",
]


def _params(rank, shapes):
    return {name: values(name, rank, shape, dtype) for name, (shape, dtype) in shapes.items()}


@pytest.mark.parametrize("root_choice", ["first", "last"])
def test_dtypes_shapes_and_any_root(comm, root_choice):
    root = 0 if root_choice == "first" else comm.size - 1
    shapes = {f"p.{d}": ((3, 5), d) for d in DTYPES}
    shapes.update(
        {"zero": ((0, 4), "float32"), "scalar": ((), "float64"), "big": ((1000, 300), "float32")}
    )
    params = _params(comm.rank, shapes)
    report = mpisync.sync_params(params, comm, root=root, verify=True, fusion_bytes=1 << 20)
    for name, (shape, dtype) in shapes.items():
        expected = values(name, root, shape, dtype)
        assert params[name].shape == tuple(shape) and params[name].dtype == np.dtype(dtype)
        assert same_bytes(params[name], expected), name
    assert report.tensors == len(shapes) and report.replicas == len(shapes)
    assert report.bytes == sum(a.nbytes for a in params.values())
    assert report.transport == ("local" if comm.size == 1 else "host")
    assert report.verified and report.seconds > 0 and report.gbps >= 0
    # one fused bucket + 'big' (1.2 MB > fusion_bytes), whichever transport moved them
    if comm.size > 1:
        assert report.channel in ("mpi", "cross-memory")
        assert report.transfers == 2 and report.fused_buckets == 1
        if report.channel == "mpi":  # Idup + validation + facts + two broadcasts + verification
            assert report.collectives == 6
    else:
        assert report.collectives == report.transfers == report.fused_buckets == 0


def test_replicas_as_list_and_mapping_with_devices(comm):
    root = comm.size // 2
    shape = (4, 6)
    a = [
        values("a", comm.rank, shape, "float32"),
        np.zeros(shape, np.float32),
        np.ones(shape, np.float32),
    ]
    master_b = values("b", comm.rank, shape, "int32")
    b = {
        "cpu:1": np.zeros(shape, np.int32),
        "cpu:0": master_b,
        "cpu:2": np.full(shape, -1, np.int32),
    }
    # first key is master
    c = {"x": values("c", comm.rank, (7,), "uint16"), "y": np.zeros(7, np.uint16)}
    report = mpisync.sync_params({"a": a, "b": b, "c": c}, comm, root=root, devices=None)
    assert report.replicas == 3 + 3 + 2
    for replica in a:
        assert same_bytes(replica, values("a", root, shape, "float32"))
    for replica in c.values():
        assert same_bytes(replica, values("c", root, (7,), "uint16"))
    # With devices, the master of a mapping is devices[0], and replicas follow devices.
    b2 = {"cpu:1": np.zeros(shape, np.int32), "cpu:0": values("b", comm.rank, shape, "int32")}
    mpisync.sync_params({"b": b2}, comm, root=root, devices=["cpu:0", "cpu:1"])
    for replica in b2.values():
        assert same_bytes(replica, values("b", root, shape, "int32"))


def test_insertion_order_differs_between_ranks(comm):
    names = [f"layer{i}.w" for i in range(40)]
    order = list(np.random.default_rng(comm.rank).permutation(names))
    params = {n: values(n, comm.rank, (i % 5 + 1, 3), "float32") for i, n in enumerate(names)}
    shuffled = {n: params[n] for n in order}
    mpisync.sync_params(shuffled, comm, root=0, fusion_bytes=64)
    for i, n in enumerate(names):
        assert same_bytes(params[n], values(n, 0, (i % 5 + 1, 3), "float32")), n


def test_sub_communicators(comm):
    sub = comm.Split(color=comm.rank % 2, key=comm.rank)
    try:
        root = sub.size - 1
        p = {"w": values("w", comm.rank, (33,), "float64")}
        mpisync.sync_params(p, sub, root=root, verify=True)
        root_world = sub.group.Translate_ranks([root], comm.group)[0]
        assert same_bytes(p["w"], values("w", root_world, (33,), "float64"))
    finally:
        sub.Free()


def test_buffer_protocol_and_dlpack_objects(comm):
    import array

    buf = array.array("i", [comm.rank] * 10)
    raw = bytearray([comm.rank] * 16)
    mpisync.sync_params({"array": buf, "bytes": raw}, comm, root=0)
    assert list(buf) == [0] * 10 and raw == bytearray(16)


@pytest.mark.parametrize("fusion_bytes", [0, 64, 1 << 20])
@pytest.mark.parametrize("max_concurrent", [1, 3])
def test_many_small_tensors_fused_and_not(comm, fusion_bytes, max_concurrent):
    shapes = {f"t{i:04d}": ((i % 17,), ["float32", "int8", "float16"][i % 3]) for i in range(500)}
    params = _params(comm.rank, shapes)
    report = mpisync.sync_params(
        params, comm, root=comm.size - 1, fusion_bytes=fusion_bytes, max_concurrent=max_concurrent
    )
    for name, (shape, dtype) in shapes.items():
        assert same_bytes(params[name], values(name, comm.size - 1, shape, dtype)), name
    if comm.size > 1 and fusion_bytes == 0:
        assert report.fused_buckets == 0
    if comm.size > 1 and fusion_bytes == 1 << 20:
        assert report.fused_buckets == 1


def test_param_sync_reuses_communicator_plan_and_buffers(comm):
    shapes = {f"w{i}": ((50 + i,), "float32") for i in range(20)}
    with mpisync.ParamSync(comm, root=0, fusion_bytes=512, max_concurrent=2) as syncer:
        syncer._compiler.chunk_bytes = (
            96  # every rank sets it: exercises chunking without 2 GiB tensors
        )
        seen = set()
        for step in range(4):
            params = {n: values(n, comm.rank + 10 * step, s, d) for n, (s, d) in shapes.items()}
            syncer.sync(params, verify=(step % 2 == 0))
            for n, (s, d) in shapes.items():
                assert same_bytes(params[n], values(n, 10 * step, s, d)), (step, n)
            seen.add(id(syncer._link.comm))
            # max_concurrent x fusion_bytes plus a constant, never the model's size
            assert syncer.buffer_bytes <= 2 * 512 + 8192
            assert (syncer._prepared is not None) == (comm.size > 1)
        assert len(seen) == 1
    assert syncer._link.comm is None
    with pytest.raises(mpisync.SyncError):
        syncer.sync(params)


def test_arrays_replaced_in_the_same_dict_are_synced(comm):
    # A repeated sync reuses its checks while the dict is unchanged; a new array put into the
    # same dict (or a key removed and put back) must be seen on every rank.
    params = {f"w{i}": values(f"w{i}", comm.rank, (30 + i,), "float32") for i in range(6)}
    with mpisync.ParamSync(comm, root=0, fusion_bytes=256) as syncer:
        for step in range(5):
            if step == 2:
                params["w3"] = values("w3", comm.rank + 100, (33,), "float32")
            if step == 3:
                params["w1"] = params.pop("w1")  # same array, the dict's order changes
            if step == 4:
                params["w5"][:] = comm.rank + 7  # new bytes in the same array
            syncer.sync(params)
            for name, array in params.items():
                reference = values(
                    name, 100 if step >= 2 and name == "w3" else 0, array.shape, "float32"
                )
                if step == 4 and name == "w5":
                    reference = np.full(array.shape, 7, np.float32)
                assert same_bytes(array, reference), (step, name)
            if comm.size > 1:
                assert syncer._prepared.recognizer.values == tuple(params.values())


@pytest.mark.parametrize("form", ["bare arrays", "replica lists"])
def test_buckets_take_turns_in_two_arena_slots_with_many_collectives_in_flight(comm, form):
    # 16 collectives may be in flight but, on one node, fused buckets share two arena slots: a
    # bucket
    # is packed (root) or received (the others) into a slot only after the bucket before it there
    # was
    # sent and unpacked. Buckets of 96 KiB move by rendezvous, where a slot overwritten too early
    # shows.
    shapes = {f"t{i:03d}": (1000 + i,) for i in range(300)}  # ~4 KiB each: about 13 buckets

    def make(seed):
        arrays = {n: values(n, seed, s, "float32") for n, s in shapes.items()}
        return arrays if form == "bare arrays" else {n: [a, a.copy()] for n, a in arrays.items()}

    with mpisync.ParamSync(comm, root=0, fusion_bytes=96 * 1024, max_concurrent=16) as syncer:
        syncer._prefer("mpi")  # the mechanism under test: collectives through an arena
        for step in range(3):
            params = make(comm.rank + 10 * step)
            report = syncer.sync(params)
            for name, shape in shapes.items():
                expected = values(name, 10 * step, shape, "float32")
                for replica in [params[name]] if form == "bare arrays" else params[name]:
                    assert same_bytes(replica, expected), (step, name)
        if comm.size > 1:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
            one_node = everyone(comm, node.size == comm.size)
            node.Free()
            # Across nodes each collective in flight keeps a slot of its own, as many as there are
            # buckets.
            slots = 2 if one_node else min(16, report.fused_buckets)
            assert report.channel == "mpi"
            assert report.fused_buckets >= 10 and syncer.buffer_bytes == slots * 96 * 1024


def test_sync_params_calls_hand_their_fusion_arena_on(comm, monkeypatch):
    # Fresh pages cost microseconds each to touch, so one sync_params call leaves its arena to the
    # next; a call that needs a larger one makes its own. Every call's bytes are root's.
    from mpisync.transports import spares

    monkeypatch.setitem(spares._SPARES, spares.ARENA, [])  # none left by earlier tests
    shapes = {f"v{i:03d}": (i % 13 + 1,) for i in range(200)}
    arenas = []
    # 11 KB in all: one bucket of 64 KiB
    for call, fusion in enumerate([1024, 1024, 64 << 10, 1024]):
        params = {n: values(n, comm.rank + call, s, "float64") for n, s in shapes.items()}
        mpisync.sync_params(params, comm, root=0, fusion_bytes=fusion)
        for name, shape in shapes.items():
            assert same_bytes(params[name], values(name, call, shape, "float64")), (call, name)
        pool = spares._SPARES[spares.ARENA]
        arenas.append(pool[-1] if pool else None)
    if comm.size == 1:
        assert arenas == [None] * 4  # no peers: no buffers
    else:
        assert arenas[0] is arenas[1] and len(arenas[0]) >= 2 * 1024
        assert arenas[2] is not arenas[1] and len(arenas[2]) >= 64 << 10  # too small: a new one
        assert arenas[3] is arenas[2]  # a larger one serves a smaller need
        assert len(spares._SPARES[spares.ARENA]) == 1


def test_library_traffic_never_matches_the_users(comm):
    need_ranks(comm, 2)
    # The user has a receive posted on COMM_WORLD; mpisync's broadcasts must not satisfy it.
    token = np.zeros(1, np.int64)
    request = comm.Irecv(token, source=0, tag=0) if comm.rank == 1 else None
    p = {"w": values("w", comm.rank, (10,), "float32")}
    mpisync.sync_params(p, comm, root=0)
    if comm.rank == 0:
        comm.Send(np.array([42], np.int64), dest=1, tag=0)
    if request is not None:
        request.Wait()
        assert token[0] == 42
    assert same_bytes(p["w"], values("w", 0, (10,), "float32"))


def test_request_ring_caps_requests_in_flight(comm):
    ring = mpisync.RequestRing(2)
    bufs = [values(f"r{i}", comm.rank, (100,), "float32") for i in range(7)]
    peak = 0
    for buf in bufs:
        ring.push(comm.Ibcast(buf, root=0))
        peak = max(peak, len(ring))
    assert peak <= 2
    ring.drain()
    assert len(ring) == 0
    for i, buf in enumerate(bufs):
        assert same_bytes(buf, values(f"r{i}", 0, (100,), "float32"))
    with pytest.raises(ValueError):
        mpisync.RequestRing(0)


def test_settings_from_environment(comm, monkeypatch):
    monkeypatch.setenv("MPISYNC_FUSION_BYTES", "0")
    monkeypatch.setenv("MPISYNC_MAX_CONCURRENT", "2")
    syncer = mpisync.ParamSync(comm)
    assert (
        syncer.settings.fusion_bytes.value == 0
        and syncer.settings.fusion_bytes.source == "environment"
    )
    params = {f"s{i}": values(f"s{i}", comm.rank, (3,), "int32") for i in range(5)}
    report = syncer.sync(params)
    syncer.close()
    assert report.fused_buckets == 0
    for i in range(5):
        assert same_bytes(params[f"s{i}"], values(f"s{i}", 0, (3,), "int32"))


def _flat_params(rank, shapes, order, slack=0):
    """Views end to end in one buffer, laid out in ``order``, filled with this rank's values."""
    sizes = {n: int(np.prod(s)) * np.dtype(d).itemsize for n, (s, d) in shapes.items()}
    arena = np.zeros(sum(sizes.values()) + slack * len(order), np.uint8)
    out, offset = {}, 0
    for name in order:
        shape, dtype = shapes[name]
        view = arena[offset : offset + sizes[name]].view(dtype).reshape(shape)
        view[...] = values(name, rank, shape, dtype)
        out[name] = view
        offset += sizes[name] + slack
    return arena, out


FLAT_SHAPES = {
    f"block{i:02d}.{kind}": ((64 + i, 33), "float32")
    if kind == "weight"
    else ((64 + i,), "float64")
    for i in range(12)
    for kind in ("weight", "bias")
}
FLAT_SHAPES["block05.step"] = ((), "int64")


def test_parameters_end_to_end_in_one_buffer_travel_as_one_span(comm):
    order = sorted(FLAT_SHAPES, reverse=True)  # memory order is not name order
    arena, params = _flat_params(comm.rank, FLAT_SHAPES, order)
    params["separate"] = values("separate", comm.rank, (300, 300), "float32")
    syncer = mpisync.ParamSync(comm, fusion_bytes=4096)
    syncer._prefer("mpi")  # collectives carry the bytes, so each transfer is one collective
    for attempt in range(2):  # cold, then the cached steps
        for name, view in params.items():
            view[...] = values(name, comm.rank, view.shape, view.dtype)
        report = syncer.sync(params, verify=True)
        for name, view in params.items():
            assert same_bytes(view, values(name, 0, view.shape, view.dtype)), (attempt, name)
        if comm.size > 1:  # the plan: the span, then 'separate'
            assert report.transfers == 2 and report.fused_buckets == 0 and report.channel == "mpi"
            # (Idup and the facts all-reduce, first time) + validation + the span + 'separate' +
            # verification
            assert report.collectives == (6 if attempt == 0 else 4)
    syncer.close()


def test_a_rank_with_another_layout_falls_back_to_per_tensor_transfers(comm):
    order = sorted(FLAT_SHAPES)
    if comm.rank == comm.size - 1:
        order = order[1:] + order[:1]  # one rank puts the first tensor last
    syncer = mpisync.ParamSync(comm, fusion_bytes=4096)
    seen = []
    for attempt, slack in enumerate([0, 0, 8]):  # then a gap between tensors on every rank: no runs
        arena, params = _flat_params(
            comm.rank, FLAT_SHAPES, order if attempt else sorted(FLAT_SHAPES), slack
        )
        report = syncer.sync(params)
        for name, view in params.items():
            assert same_bytes(view, values(name, 0, view.shape, view.dtype)), (attempt, name)
        seen.append(report.transfers)
    syncer.close()
    if comm.size > 1:
        assert seen[0] == 1  # one span: every rank had the same layout
        # layouts differ / no runs: a transfer per tensor
        assert seen[1] > 20 and seen[2] == seen[1]


def test_ranks_on_the_bulk_and_the_general_path_match(comm):
    # A dict of bare numpy arrays takes mpisync.params.bulk's path; the same set held as one-replica
    # lists takes the general one. Mixed across ranks, digests and collectives must still match.
    from mpisync.params.bulk import scan

    shapes = {f"s{i:03d}": ((i % 7 + 1,), "float32") for i in range(300)}
    shapes.update(
        {"big": ((5000,), "float64"), "empty": ((0,), "int8"), "scalar": ((), "complex64")}
    )
    params = _params(comm.rank, shapes)
    general = comm.rank % 2 == 1
    if general:
        params = {name: [array] for name, array in params.items()}
    took_bulk = (
        scan(params, rank=comm.rank, size=comm.size, root=0, devices=None, settings={}) is not None
    )
    assert took_bulk == (not general)  # with the C loops or their Python form alike
    report = mpisync.sync_params(params, comm, root=0, fusion_bytes=1024, verify=True)
    for name, (shape, dtype) in shapes.items():
        got = params[name][0] if general else params[name]
        assert same_bytes(got, values(name, 0, shape, dtype)), name
    if comm.size > 1:  # 300 tensors of 4-28 B in 1 KiB buckets, 'big' (40 kB) on its own
        assert report.fused_buckets == 5 and report.transfers == 6 and report.verified


def test_tied_weights_travel_once(comm):
    # One array under two names travels once when every rank ties them alike; a rank that holds
    # them apart gets root's bytes in both.
    big = values("big", comm.rank, (300_000,), "float32")
    small = values("small", comm.rank, (10,), "float32")
    params = {"a": big, "b": big, "c": small}
    report = mpisync.sync_params(params, comm, root=0)
    assert same_bytes(big, values("big", 0, (300_000,), "float32"))
    assert same_bytes(small, values("small", 0, (10,), "float32"))
    if comm.size > 1:
        assert report.transfers == 2  # 'a' in place and 'c' in a bucket: 'b' is 'a'
    apart = {"a": values("big", comm.rank, (300_000,), "float32"), "c": small}
    apart["b"] = apart["a"] if comm.rank == 0 else values("big", comm.rank, (300_000,), "float32")
    mpisync.sync_params(apart, comm, root=0)
    for name in ("a", "b"):
        assert same_bytes(apart[name], values("big", 0, (300_000,), "float32"))
