"""mpisync.allreduce and GradSync: every op and dtype against numpy, replicas, reuse, errors."""

import numpy as np
import pytest

import mpisync
from mpisync.devices.simulated import SimulatedDeviceArray

from mpiutil import everyone, last_rank, need_ranks, raises_everywhere

pytestmark = pytest.mark.mpi

_REFERENCE = {"sum": np.sum, "avg": np.sum, "min": np.min, "max": np.max, "prod": np.prod}
_DTYPES = ["float32", "float64", "int32", "int64", "uint8", "int8", "float16", "complex64"]
_SIZES = {"a.tiny": 3, "b.small": 700, "c.large": 20000, "d.scalar": 1}


def _values(name: str, rank: int, replica: int, n: int, dtype) -> np.ndarray:
    # Every rank and replica holds different values (min, max, sum tell whether ranks were reduced),
    # small enough that sums stay exact in every dtype.
    base = (np.arange(n) * 7 + len(name) + rank + replica) % 3 + 1
    return base.astype(dtype)


def _reference_dtype(dtype):
    kind = np.dtype(dtype).kind
    # Integers in int64: a product that wraps in the dtype wraps alike in MPI, numpy and this
    # reference.
    return np.int64 if kind in "iu" else np.complex128 if kind == "c" else np.float64


def _expected(
    op: str, name: str, size: int, replicas: int, n: int, dtype, salt: int = 0
) -> np.ndarray:
    every = np.stack(
        [
            _values(name, r, salt + k, n, _reference_dtype(dtype))
            for r in range(size)
            for k in range(replicas)
        ]
    )
    out = _REFERENCE[op](every, axis=0)
    if op == "avg":
        count = size * replicas
        out = np.floor_divide(out, count) if np.dtype(dtype).kind in "iu" else out / count
    return out.astype(dtype)


def _params(rank: int, dtype, replicas: int) -> dict:
    out = {}
    for name, n in _SIZES.items():
        arrays = [_values(name, rank, k, n, dtype) for k in range(replicas)]
        out[name] = arrays[0] if replicas == 1 else arrays
    return out


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_every_op_and_dtype_matches_numpy(comm, op, dtype):
    if dtype == "complex64" and op in ("min", "max"):
        pytest.skip("no ordering for complex values (refused: see test_refused_inputs)")
    params = _params(comm.rank, dtype, replicas=2)
    report = mpisync.allreduce(params, comm, op=op, fusion_bytes=4096)
    assert report.tensors == len(_SIZES) and report.replicas == 2 * len(_SIZES)
    for name, n in _SIZES.items():
        expected = _expected(op, name, comm.size, 2, n, dtype)
        for replica in params[name]:
            if np.dtype(dtype).kind in "iu":
                assert np.array_equal(replica, expected), (name, replica[:5], expected[:5])
            else:
                assert np.allclose(replica, expected, rtol=1e-3 if dtype == "float16" else 1e-6), (
                    name
                )


class _OtherDict(dict):
    """A dict subclass: the general path (a plain dict of arrays of one dtype takes the bulk
    scan)."""


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "int32", "int64", "uint8", "complex64", "mixed"]
)
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
def test_one_array_per_name_on_the_bulk_and_general_paths_matches_numpy(comm, op, dtype):
    _bulk_beside_general(comm, op, dtype, "subclass")


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_bulk_ranks_beside_ranks_holding_replica_lists(comm, op):
    _bulk_beside_general(comm, op, "mixed", "lists")


def _bulk_beside_general(comm, op, dtype, other):
    if dtype == "complex64" and op in ("min", "max"):
        pytest.skip("no ordering for complex values (refused: see test_refused_inputs)")
    # Odd ranks pass a dict subclass (kept and reused), or one-replica lists (prepared again at
    # every call): ranks on both paths must issue the same collectives on the same bucket layout.
    from mpisync.allreduce.bulk import scan_for_reduce

    sizes = dict(
        _SIZES,
        **{"a.empty": 0, "e.more": 300, "f.more": 90},
        **{f"g.{i:02d}": 500 for i in range(50)},
    )
    mixed = ("float64", "int64", "float32", "int64")  # "mixed": dtypes interleaved in sorted order
    kinds = {
        name: mixed[i % 4] if dtype == "mixed" else dtype for i, name in enumerate(sorted(sizes))
    }
    mapping = _OtherDict if comm.rank % 2 and other == "subclass" else dict
    params = mapping(
        {name: _values(name, comm.rank, 0, n, kinds[name]) for name, n in sizes.items()}
    )
    arrays = dict(params)
    if comm.rank % 2 and other == "lists":
        params = {name: [array] for name, array in arrays.items()}
    # summed in int64
    staged = op == "avg" and any(kinds[name] in ("int32", "uint8") for name in sizes)
    took_bulk = (
        scan_for_reduce(
            params,
            op,
            rank=comm.rank,
            size=comm.size,
            devices=None,
            settings={"op": op, "fusion_bytes": 16384},
        )
        is not None
    )
    # with the C loops or their Python form alike
    assert took_bulk == (not comm.rank % 2 and not staged)
    with mpisync.GradSync(comm, op=op, fusion_bytes=16384) as syncer:
        for call in range(3):
            for name, n in sizes.items():
                arrays[name][...] = _values(name, comm.rank, call, n, kinds[name])
            report = syncer.allreduce(params)
            assert report.channel == "mpi", call
            for name, n in sizes.items():
                expected = _expected(op, name, comm.size, 1, n, kinds[name], salt=call)
                if np.dtype(kinds[name]).kind in "iu":
                    assert arrays[name].tobytes() == expected.tobytes(), (call, name)
                else:
                    assert np.allclose(arrays[name], expected, rtol=1e-6), (call, name)


@pytest.mark.parametrize("who", ["one rank", "every rank"])
def test_an_array_resized_in_place_is_never_reduced_at_its_old_address(comm, who):
    need_ranks(comm, 2)
    params = {f"g{i}": np.full(1000, comm.rank + i, np.float64) for i in range(4)}
    with mpisync.GradSync(comm, op="sum", timeout=60) as syncer:
        syncer.allreduce(params)
        resized = who == "every rank" or comm.rank == last_rank(comm)
        if resized:
            params["g2"].resize((50_000,), refcheck=False)  # reallocated: the old memory is freed
        for i, a in enumerate(params.values()):
            a[...] = comm.rank + 10 * i
        if who == "one rank":
            before = {n: a.copy() for n, a in params.items()}
            raises_everywhere(
                comm, mpisync.ManifestMismatchError, lambda: syncer.allreduce(params), "'g2'"
            )
            assert all(params[n].tobytes() == before[n].tobytes() for n in params)
        else:
            syncer.allreduce(params)
            total = sum(range(comm.size))
            for i, a in enumerate(params.values()):
                assert (
                    a.tobytes() == np.full(a.size, total + comm.size * 10 * i, np.float64).tobytes()
                ), i
            assert params["g2"].size == 50_000


def test_a_torch_tensor_given_new_memory_is_reduced_there(comm):
    torch = pytest.importorskip("torch")
    grads = {f"p{i}": torch.full((300,), float(comm.rank + i)) for i in range(6)}
    grads.update({f"q{i}": torch.zeros(2000) for i in range(6)})  # 55 kB fused
    total = sum(range(comm.size))
    with mpisync.GradSync(comm, op="sum", fusion_bytes=16384) as syncer:
        syncer.allreduce(grads)
        syncer.allreduce(grads)  # the prepared set, reused
        grads["p3"].data = torch.full((300,), 100.0 + comm.rank)  # the same object, new memory
        syncer.allreduce(grads)
    assert torch.equal(grads["p3"], torch.full((300,), 100.0 * comm.size + total))
    assert torch.equal(grads["p1"], torch.full((300,), float(comm.size**2 * (total + comm.size))))


def test_torch_bfloat16_and_float16_reduce_in_float32(comm):
    torch = pytest.importorskip("torch")
    half = torch.full((1000,), 1.0 + comm.rank, dtype=torch.bfloat16)
    small = torch.full((3,), 0.5, dtype=torch.float16)
    mpisync.allreduce({"half": half, "small": small}, comm, op="sum", fusion_bytes=1024)
    total = sum(1.0 + r for r in range(comm.size))
    assert half.dtype == torch.bfloat16 and torch.all(half == total)
    assert torch.all(small == 0.5 * comm.size)


def test_gradsync_reuses_its_plan_and_sees_new_values(comm):
    params = {f"w{i:03d}": np.zeros(50 + i, np.float32) for i in range(40)}
    params["big"] = np.zeros(100000, np.float64)
    with mpisync.GradSync(comm, op="avg", fusion_bytes=2048) as syncer:
        for step in range(4):
            for array in params.values():
                array[...] = comm.rank + step
            report = syncer.allreduce(params)
            mean = sum(r + step for r in range(comm.size)) / comm.size
            assert all(np.allclose(a, mean) for a in params.values()), step
        assert report.fused_buckets >= 2 and report.transfers == report.fused_buckets + 1
        # One agreement, then one all-reduce per bucket and one for the large array (800 kB).
        assert report.channel == "mpi"
        per_call = 1 + report.fused_buckets + 1
        assert report.collectives == (per_call if comm.size > 1 else 0)
    with pytest.raises(mpisync.SyncError, match="closed"):
        syncer.allreduce(params)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "prod"])
def test_fused_buckets_of_several_dtypes_repeated(comm, op):
    dtypes = ["float32", "int64", "float16", "uint8"]
    shapes = {f"{d}.{i:03d}": (5 + i, d) for d in dtypes for i in range(60)}
    shapes["float64.big"] = (40000, "float64")
    params = {name: _values(name, comm.rank, 0, n, d) for name, (n, d) in shapes.items()}
    expected = {name: _expected(op, name, comm.size, 1, n, d) for name, (n, d) in shapes.items()}
    # reduced in float32; avg of uint8 in int64
    widened = {"float16": 2, "uint8": 8 if op == "avg" else 1}
    fused = sum(
        a.nbytes * widened.get(a.dtype.name, 1) for n, a in params.items() if n != "float64.big"
    )
    with mpisync.GradSync(comm, op=op, fusion_bytes=4096) as syncer:
        for call in range(2):
            report = syncer.allreduce(params)
            assert report.channel == "mpi"
            for name, array in params.items():
                assert array.tobytes() == expected[name].tobytes(), (call, name)
                array[...] = _values(name, comm.rank, 0, *shapes[name])
        # one fusion arena, nothing else kept
        assert fused <= syncer.buffer_bytes <= fused + 4096 * len(dtypes)
        if comm.size > 1:  # the agreement, each bucket, the large tensor
            assert report.collectives == 1 + report.fused_buckets + 1


def test_a_larger_set_after_a_smaller_one(comm):
    small = {f"s{i}": np.full(400, comm.rank + i, np.float32) for i in range(20)}
    large = {f"s{i}": np.full(4000, comm.rank + i, np.float32) for i in range(20)}  # 5 buckets
    with mpisync.GradSync(comm, op="sum", fusion_bytes=1 << 16) as syncer:
        first = syncer.allreduce(small)
        syncer.allreduce(small)
        larger = syncer.allreduce(large)
        syncer.allreduce({k: np.full(400, comm.rank + 100.0, np.float32) for k in small})
    total = sum(range(comm.size))
    for i in range(20):
        assert small[f"s{i}"].tolist() == [float(comm.size * (total + comm.size * i))] * 400
        assert large[f"s{i}"].tolist() == [float(total + comm.size * i)] * 4000
    assert (first.fused_buckets, larger.fused_buckets) == (1, 5)


def test_scalars_and_a_small_array(comm):
    params = {"loss": np.array(comm.rank + 1.0), "acc": np.full(8, float(comm.rank), np.float32)}
    with mpisync.GradSync(comm, op="sum") as syncer:
        channels = [syncer.allreduce(params).channel for _ in range(3)]
    assert channels == ["mpi"] * 3
    total = sum(range(comm.size))
    assert float(params["loss"]) == float(comm.size**2 * (total + comm.size))
    assert params["acc"].tolist() == [float(comm.size**2 * total)] * 8


def test_many_fused_buckets(comm):
    params = {f"t{i:03d}": np.full(100, comm.rank + i, np.float64) for i in range(100)}  # 80 kB
    with mpisync.GradSync(comm, op="max", fusion_bytes=4096) as syncer:
        report = syncer.allreduce(params)
    assert report.channel == "mpi" and report.fused_buckets >= 20
    assert all(params[f"t{i:03d}"].tolist() == [float(comm.size - 1 + i)] * 100 for i in range(100))


def test_mapping_replicas_with_devices_order(comm):
    params = {"w": {"gpu1": np.full(4, 2.0), "gpu0": np.full(4, 1.0)}}
    mpisync.allreduce(params, comm, op="max", devices=["gpu0", "gpu1"])
    assert params["w"]["gpu0"].tolist() == [2.0] * 4 and params["w"]["gpu1"].tolist() == [2.0] * 4


def test_simulated_device_replicas_are_staged(comm):
    replicas = [
        SimulatedDeviceArray(np.full(300, float(comm.rank + k), np.float32), device=k)
        for k in range(2)
    ]
    report = mpisync.allreduce({"w": replicas, "host": np.ones(5)}, comm, op="sum")
    expected = sum(r + k for r in range(comm.size) for k in range(2))
    assert report.transport == "staged"
    for replica in replicas:
        assert np.all(replica.get() == expected)


def test_zero_size_and_zero_dim_arrays(comm):
    params = {"empty": np.zeros(0, np.float32), "scalar": np.array(comm.rank + 1.0)}
    mpisync.allreduce(params, comm, op="sum")
    assert float(params["scalar"]) == sum(r + 1.0 for r in range(comm.size))


def test_refused_inputs_raise_everywhere(comm):
    flags = np.zeros(3, bool)
    raises_everywhere(
        comm, mpisync.InvalidParamError, lambda: mpisync.allreduce({"f": flags}, comm), "dtype bool"
    )
    complex_ = np.zeros(3, np.complex64)
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.allreduce({"c": complex_}, comm, op="max"),
        "not defined for complex",
    )
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.allreduce({"x": np.zeros(2)}, comm, op="mean"),
        "op must be one of",
    )
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.allreduce({"ro": frozen}, comm),
        "read-only",
    )


def test_bad_input_on_one_rank_raises_everywhere_and_writes_nothing(comm):
    need_ranks(comm, 2)
    good = np.full(8, float(comm.rank))
    value = np.zeros((4, 4))[:, 1] if comm.rank == last_rank(comm) else np.zeros(4)
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.allreduce({"good": good, "bad": value}, comm),
        f"rank(s) {last_rank(comm)}",
        "'bad'",
    )
    assert np.all(good == comm.rank)


def test_mismatched_shapes_raise_everywhere_and_write_nothing(comm):
    need_ranks(comm, 2)
    n = 5 if comm.rank == last_rank(comm) else 4
    grads = {"w": np.full(n, 1.0), "v": np.full(3, float(comm.rank))}
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.allreduce(grads, comm),
        "'w'",
        "shape (5,)",
    )
    assert np.all(grads["v"] == comm.rank) and np.all(grads["w"] == 1.0)


def test_mismatched_op_raises_everywhere(comm):
    need_ranks(comm, 2)
    op = "max" if comm.rank == last_rank(comm) else "sum"
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.allreduce({"w": np.ones(3)}, comm, op=op),
        "op",
    )


def test_cuda_tensors(comm):
    torch = pytest.importorskip("torch")

    if not everyone(comm, torch.cuda.is_available()):
        pytest.skip("needs a CUDA device on every rank")
    grad = torch.full((1000,), float(comm.rank), device="cuda")
    report = mpisync.allreduce({"g": grad}, comm, op="sum")
    assert report.transport == "staged"
    assert torch.all(grad.cpu() == sum(range(comm.size)))


@pytest.mark.parametrize("fusion_bytes", [4096, 0], ids=["fused", "direct"])
def test_integer_avg_sums_without_overflowing_the_dtype(comm, fusion_bytes):
    # int8 avg(100, 100) is 100, not (200 wrapped to -56) // 2 = -28: the sum is taken in int64.
    params = {
        "i8": [np.full(5, 100, np.int8), np.full(5, 110, np.int8)],
        "u8": [np.full(300, 250, np.uint8), np.full(300, 240, np.uint8)],
        "i32": [np.full(7, 2**31 - 1 - comm.rank, np.int32), np.full(7, 2**31 - 3, np.int32)],
    }
    mpisync.allreduce(params, comm, op="avg", fusion_bytes=fusion_bytes)
    count = 2 * comm.size
    i32 = (sum(2**31 - 1 - r for r in range(comm.size)) + comm.size * (2**31 - 3)) // count
    for name, value in (("i8", 105), ("u8", 245), ("i32", i32)):
        for replica in params[name]:
            assert replica.tolist() == [value] * replica.size, (name, replica[:3])


def _gathered_bytes(comm, array) -> list:
    # test-side only: every rank's bytes, to compare ranks with each other
    return comm.allgather(np.ascontiguousarray(array).tobytes())


@pytest.mark.parametrize("n", [100, 300_000], ids=["fused", "direct"])
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
def test_tied_weights_are_reduced_once(comm, op, n):
    # One storage under two names (a language model's head.weight = emb.weight): reduced once,
    # below fusion_bytes (a bucket) and above it (in place), one-shot and through a GradSync whose
    # later calls reuse their plan.
    torch = pytest.importorskip("torch")
    emb = torch.nn.Embedding(n // 10, 10)
    head = torch.nn.Linear(10, n // 10, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "norm": torch.nn.LayerNorm(10)})
    expected = {"sum": sum(range(1, comm.size + 1)), "avg": (comm.size + 1) / 2, "max": comm.size}
    with mpisync.GradSync(comm, op=op) as syncer:
        for call in range(4):
            with torch.no_grad():
                emb.weight.fill_(comm.rank + 1)
            state = model.state_dict()
            report = mpisync.allreduce(state, comm, op=op) if call == 0 else syncer.allreduce(state)
            assert report.tensors == 4
            assert emb.weight.unique().tolist() == [expected[op]], (call, report.channel)
            assert len(set(_gathered_bytes(comm, emb.weight.detach()))) == 1


@pytest.mark.parametrize("form", ["the same array", "a view of it"])
def test_numpy_arrays_under_two_names_are_reduced_once(comm, form):
    for n in (50, 100_000):
        w = np.full(n, comm.rank + 1, np.float64)
        params = {"a": w, "b": w if form == "the same array" else w[:], "c": np.ones(3)}
        mpisync.allreduce(params, comm, op="sum")
        assert (w == sum(range(1, comm.size + 1))).all() and (params["c"] == comm.size).all()


def test_partly_overlapping_names_raise_everywhere(comm):
    w = np.ones(1000, np.float32)
    params = {"a": w[:600], "b": w[400:]}
    before = w.copy()
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.allreduce(params, comm, op="sum"),
        "parameter 'b': overlaps 'a' in memory",
    )
    assert (w == before).all()


def test_a_tie_on_one_rank_only_raises_everywhere(comm):
    need_ranks(comm, 2)
    w = np.ones(10, np.float32)
    tied = comm.rank == last_rank(comm)
    params = {"a": w, "b": w if tied else np.ones(10, np.float32)}
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.allreduce(params, comm, op="sum"),
        "tied",
    )


_NAN_CASES = {
    # rank -> values; at every position some rank holds NaN, or none does (then the plain min/max)
    "min": ([np.nan, 2.0, -0.0, 1.0, 5.0], [1.0, np.nan, 0.0, -1.0, np.inf]),
    "max": ([np.nan, 2.0, -0.0, 1.0, -5.0], [1.0, np.nan, 0.0, -1.0, -np.inf]),
}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["min", "max"])
def test_nan_wins_min_and_max_with_the_same_bytes_on_every_rank_and_channel(comm, op, dtype):
    # numpy's and torch's rule (NaN wins), whatever path a value takes: one-shot, and a reused
    # GradSync (its prepared set reused).
    torch = pytest.importorskip("torch") if dtype == "bfloat16" else None
    rows = _NAN_CASES[op]
    mine = rows[comm.rank % 2]
    expected = [
        np.nan
        if any(np.isnan(r[i]) for r in rows[: min(comm.size, 2)])
        else (min if op == "min" else max)(r[i] for r in rows[: min(comm.size, 2)])
        for i in range(len(mine))
    ]

    def fresh():
        if torch is not None:
            return {f"p{k}": torch.tensor(mine * 40, dtype=torch.bfloat16) for k in range(12)}
        return {f"p{k}": np.array(mine * 40, dtype) for k in range(12)}

    seen = []
    with mpisync.GradSync(comm, op=op) as syncer:
        for call in range(4):
            params = fresh()
            report = (
                mpisync.allreduce(params, comm, op=op) if call == 0 else syncer.allreduce(params)
            )
            got = params["p0"].float().numpy() if torch is not None else params["p0"]
            assert np.array_equal(got[:5].astype(np.float64), expected, equal_nan=True), (
                call,
                report.channel,
                got[:5],
            )
            raw = params["p0"].view(torch.int16).numpy() if torch is not None else params["p0"]
            seen.append(np.ascontiguousarray(raw).tobytes())
    assert len(set(seen)) == 1  # every call and channel gave the same bytes
    assert len(set(comm.allgather(seen[0]))) == 1  # and so did every rank
    assert not np.signbit(got[np.isnan(got)]).any()  # NaN results are positive NaNs


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_mid_size_arrays_reduced_in_their_own_memory(comm, op, dtype, replicas):
    """Arrays above ``fusion_bytes`` (reduced in their own memory, under cross-memory's floor:
    MPI) beside a fused bucket; every call exact."""
    n = (1 << 20) // 8 + 3  # int64: a little over 1 MiB, with b.mid a third of it
    shapes = {"a.mid": n, "b.mid": n // 3, "c.small": 5}
    channels = []
    with mpisync.GradSync(comm, op=op, fusion_bytes=32 << 10) as syncer:
        for call in range(4):
            params = {}
            for name, count in shapes.items():
                arrays = [_values(name, comm.rank, call + k, count, dtype) for k in range(replicas)]
                params[name] = arrays[0] if replicas == 1 else arrays
            report = syncer.allreduce(params)
            channels.append(report.channel)
            for name, count in shapes.items():
                want = _expected(op, name, comm.size, replicas, count, dtype, salt=call)
                got = params[name]
                for array in got if replicas > 1 else [got]:
                    assert array.tobytes() == want.tobytes(), (call, name)
    assert channels == ["mpi"] * 4


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_reduce_transport_runs_a_set_behind_the_transport_interface(comm, replicas):
    # The path GradSync takes, step by step: a ReduceSet (the bulk scan's with one replica each,
    # the general manifest's with replica lists), its plan, the transport's program, its run.
    from mpisync._runtime.clock import Deadline, Trace
    from mpisync.allreduce.gradsync import _reduce_manifest
    from mpisync.allreduce.reduceset import ReduceSet
    from mpisync.allreduce.transport import ReduceTransport
    from mpisync.params.bulk import BulkManifest
    from mpisync.report import SyncReport
    from mpisync.transports.base import Context, Transport

    shapes = {f"p{i}": (10 + i, "float32") for i in range(6)} | {"big": (5000, "float64")}

    def replicas_of(name, n, dtype):
        arrays = [_values(name, comm.rank, k, n, dtype) for k in range(replicas)]
        return arrays[0] if replicas == 1 else arrays

    params = {name: replicas_of(name, *shape) for name, shape in shapes.items()}
    manifest = _reduce_manifest(params, None, comm.rank, comm.size, "sum", 256, None, {})
    assert isinstance(manifest, BulkManifest) == (replicas == 1)
    dup = comm.Dup()
    transport = ReduceTransport(dup, "sum", 256)
    assert isinstance(transport, Transport)
    report = SyncReport.of(manifest, rank=comm.rank, size=comm.size, transport="host")
    ctx = Context(dup, 0, Deadline(60.0), report, Trace(), 2, False)
    reduced = ReduceSet(manifest, "sum", comm.size)
    program = transport.compile(reduced, reduced.plan(256), 256, ctx)
    # "big" (sorted first, its dtype's group first) in place, then the 6 small tensors (260
    # bytes) in 2 buckets of at most 256 bytes
    assert [step.fused for step in program.steps] == [False, True, True]
    assert transport.nbytes == 0 and len(program.arena) >= 260
    assert reduced.before() is False
    transport.run(program, ctx)
    reduced.after()
    assert ctx.pending is None  # nothing in flight once the run is over
    assert report.collectives == (3 if comm.size > 1 else 0) and report.fused_buckets == 2
    for name, (n, dtype) in shapes.items():
        want = _expected("sum", name, comm.size, replicas, n, dtype).tobytes()
        got = [params[name]] if replicas == 1 else params[name]
        assert [a.tobytes() for a in got] == [want] * replicas, name
    transport.close()
    dup.Free()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_none_on_every_rank_is_skipped_and_stays_none(comm, kind):
    """A frozen or unused layer (``p.grad is None`` on every rank) is skipped, as DDP does; the
    other names are reduced, at 1-4 ranks, also on the reused plan."""

    def make(n, value):
        return np.full(n, float(value))

    if kind == "torch":
        torch = pytest.importorskip("torch")  # installed or not: the same on every rank

        def make(n, value):
            return torch.full((n,), float(value))

    size = comm.size
    with mpisync.GradSync(comm, op="avg") as reducer:
        for step in range(3):
            grads = {
                "frozen.w": None,
                "fc.b": make(5, comm.rank + step),
                "fc.w": make(70_000, 2 * comm.rank),
                "unused.b": None,
            }
            report = reducer.allreduce(grads)
            assert grads["frozen.w"] is None and grads["unused.b"] is None
            assert sorted(grads) == ["fc.b", "fc.w", "frozen.w", "unused.b"]
            assert report.tensors == 2
            mean = sum(range(size)) / size
            assert np.array_equal(np.asarray(grads["fc.b"]), np.full(5, mean + step))
            assert np.array_equal(np.asarray(grads["fc.w"]), np.full(70_000, 2 * mean))
    everything_none = {"a": None, "b": None}
    assert mpisync.allreduce(everything_none, comm).tensors == 0
    assert everything_none == {"a": None, "b": None}


def test_none_on_some_ranks_raises_everywhere_and_writes_nothing(comm):
    need_ranks(comm, 2)
    last = last_rank(comm)
    grads = {"w": np.full(4, 1.0), "v": None if comm.rank == last else np.full(3, 7.0)}
    message = raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.allreduce(grads, comm),
        f"'v' is None on rank(s) {last}, an array on rank(s) ",
        "torch.zeros_like(p)",
        "mpisync.horovod.DistributedOptimizer",
    )
    assert message.startswith("mpisync: a gradient is None on some ranks and an array on others")
    assert np.all(grads["w"] == 1.0)
    assert grads["v"] is None if comm.rank == last else np.all(grads["v"] == 7.0)
    # The reusable form: a name None on every rank at one call and an array at the next.
    with mpisync.GradSync(comm) as reducer:
        w = np.full(4, 1.0)
        reducer.allreduce({"w": w, "v": None})
        v = np.full(3, float(comm.rank))
        reducer.allreduce({"w": w, "v": v})
        assert np.all(w == comm.size**2) and np.all(v == sum(range(comm.size)))
        raises_everywhere(
            comm,
            mpisync.ManifestMismatchError,
            lambda: reducer.allreduce({"w": w, "v": None if comm.rank == 0 else v}),
            "'v' is None on rank(s) 0, an array on rank(s) ",
        )


def test_a_repeated_float_reduction_gives_the_same_bytes_on_every_call(comm):
    """The same inputs give the same bytes on every call, one-shot or reused, whatever path the
    sizes take (at three ranks and more, MPI sums in another order than the node's paths: a path
    taken from some later call on would change the bytes)."""
    rng = np.random.default_rng(comm.rank)
    shapes = {"mid": 1 << 18, **{f"small.{i:02d}": 3000 for i in range(20)}}
    base = {name: rng.standard_normal(n).astype(np.float32) for name, n in shapes.items()}
    seen = set()
    with mpisync.GradSync(comm, op="sum") as syncer:
        for call in range(4):
            params = {name: a.copy() for name, a in base.items()}
            if call == 0:
                mpisync.allreduce(params, comm, op="sum")
            else:
                syncer.allreduce(params)
            seen.add(b"".join(params[name].tobytes() for name in sorted(params)))
    assert len(seen) == 1
