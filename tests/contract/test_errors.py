"""Bad input anywhere: every rank raises the same documented error, and no replica is written."""

import numpy as np
import pytest

import mpisync
from mpisync.params.manifest import build_manifest
from mpisync.params.verify import verify

from mpiutil import last_rank, need_ranks, raises_everywhere, same_bytes, values

pytestmark = pytest.mark.mpi


def _good(rank, n=6):
    return {
        f"w{i}": [values(f"w{i}", rank, (4, i + 1), "float32"), np.zeros((4, i + 1), np.float32)]
        for i in range(n)
    }


def _snapshot(params):
    return {
        n: [np.array(r, copy=True) for r in (v if isinstance(v, list) else [v])]
        for n, v in params.items()
    }


def _untouched(params, snapshot):
    for name, replicas in snapshot.items():
        current = params[name] if isinstance(params[name], list) else [params[name]]
        for now, before in zip(current, replicas):
            assert same_bytes(now, before), f"{name} was written"


# Bare arrays (a plain dict of numpy arrays) take mpisync.params.bulk's path when its C loops are
# built;
# its errors must read as the general path's, which words them.
FORMS = ["replica lists", "bare arrays"]


def _held_as(params, form):
    return {n: v[0] for n, v in params.items()} if form == "bare arrays" else params


@pytest.mark.parametrize("form", FORMS)
def test_read_only_replica_on_a_receiver(comm, form):
    need_ranks(comm, 2)
    bad = last_rank(comm)
    params = _held_as(_good(comm.rank), form)
    replica = 1 if form == "replica lists" else 0
    if comm.rank == bad:
        (params["w3"][1] if form == "replica lists" else params["w3"]).flags.writeable = False
    before = _snapshot(params)
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm, root=0),
        f"rank(s) {bad}",
        f"rank {bad}: parameter 'w3': replica {replica} is read-only",
    )
    _untouched(params, before)


def test_read_only_master_is_fine_on_root(comm):
    params = {"w": values("w", comm.rank, (5,), "int32")}
    if comm.rank == 0:
        params["w"].flags.writeable = False
    mpisync.sync_params(params, comm, root=0)
    assert same_bytes(params["w"], values("w", 0, (5,), "int32"))


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("kind", ["shape", "dtype", "missing", "extra", "count"])
def test_manifest_mismatch_on_one_rank(comm, kind, form):
    need_ranks(comm, 2)
    if kind == "count" and form == "bare arrays":
        pytest.skip("a bare array is one replica")
    bad = last_rank(comm)
    params = _good(comm.rank)
    if comm.rank == bad:
        if kind == "shape":
            params["w2"] = [np.zeros((4, 4), np.float32), np.zeros((4, 4), np.float32)]
        elif kind == "dtype":
            params["w2"] = [np.zeros((4, 3), np.float64), np.zeros((4, 3), np.float64)]
        elif kind == "missing":
            del params["w2"]
        elif kind == "extra":
            params["zz"] = np.zeros(3, np.float32)
        else:
            params["w2"] = params["w2"][:1]
    params = _held_as({n: v if isinstance(v, list) else [v] for n, v in params.items()}, form)
    before = _snapshot(params)
    expected = {
        "shape": "has shape (4, 4), root has (4, 3)",
        "dtype": "has dtype float64, root has float32",
        "missing": "parameter 'w2' is missing",
        "extra": "parameter 'zz' is not on root rank 0",
        "count": "has 1 replica(s), root has 2",
    }[kind]
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.sync_params(params, comm, root=0),
        f"on rank(s) {bad}:",
        f"rank {bad}: ",
        expected,
    )
    _untouched(params, before)


@pytest.mark.parametrize(
    "kind",
    [
        "non-contiguous",
        "replica-shape",
        "replica-dtype",
        "object",
        "object-dtype",
        "not-a-mapping",
        "no-replicas",
        "missing-device",
        "name-type",
    ],
)
def test_invalid_input_on_one_rank(comm, kind):
    bad = last_rank(comm)
    params = _good(comm.rank)
    if comm.rank == bad:
        if kind == "non-contiguous":
            params["w1"] = np.zeros((4, 4), np.float32)[:, :2]
        elif kind == "replica-shape":
            params["w1"][1] = np.zeros((2, 2), np.float32)
        elif kind == "replica-dtype":
            params["w1"][1] = np.zeros((4, 2), np.int32)
        elif kind == "object":
            params["w1"] = "not an array"
        elif kind == "object-dtype":
            params["w1"] = np.array([None, 1], dtype=object)
        elif kind == "not-a-mapping":
            params = list(params.values())
        elif kind == "no-replicas":
            params["w1"] = []
        elif kind == "missing-device":
            params["w1"] = {"gpu0": params["w1"][0]}
        else:
            params[3] = np.zeros(2)
    before = _snapshot(params) if isinstance(params, dict) else None
    devices = ["cpu0"] if kind == "missing-device" else None
    if devices is not None:
        params = {n: (v if isinstance(v, dict) else {"cpu0": v[0]}) for n, v in params.items()}
    expected = {
        "non-contiguous": "not C-contiguous",
        "replica-shape": "replica 1 has shape (2, 2)",
        "replica-dtype": "replica 1 has shape (4, 2) dtype int32",
        "object": "unsupported object of type builtins.str",
        "object-dtype": "holds Python objects",
        "not-a-mapping": "params must be a mapping",
        "no-replicas": "has no replicas",
        "missing-device": "no replica for device(s) ['cpu0']",
        "name-type": "parameter names must be str",
    }[kind]
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm, root=0, devices=devices),
        f"rank(s) {bad}",
        expected,
    )
    if before is not None and devices is None:
        _untouched(params, before)


def test_root_out_of_range_everywhere(comm):
    params = _good(comm.rank)
    before = _snapshot(params)
    message = raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm, root=comm.size),
        "is not a rank",
    )
    assert isinstance(mpisync.InvalidParamError(message), ValueError)
    _untouched(params, before)


@pytest.mark.parametrize(
    "argument, on_the_last_rank, elsewhere, must_contain",
    [("root", 1, 0, ("disagree", "root")), ("fusion_bytes", 0, 1024, ("fusion_bytes",))],
)
def test_argument_differs_between_ranks(comm, argument, on_the_last_rank, elsewhere, must_contain):
    need_ranks(comm, 2)
    params = _good(comm.rank)
    before = _snapshot(params)
    value = on_the_last_rank if comm.rank == last_rank(comm) else elsewhere
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.sync_params(params, comm, **{argument: value}),
        *must_contain,
    )
    _untouched(params, before)


def test_bad_setting_on_one_rank(comm):
    params = _good(comm.rank)
    bad = last_rank(comm)
    max_concurrent = 0 if comm.rank == bad else 4
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm, max_concurrent=max_concurrent),
        f"rank {bad}: max_concurrent must be >= 1",
    )


def test_verification_names_rank_and_parameter(comm):
    need_ranks(comm, 2)
    bad = last_rank(comm)
    params = {n: values(n, 0, (8,), "int16") for n in ("a", "b", "c")}
    if comm.rank == bad:
        params["b"][3] += 1
    manifest = build_manifest(params, rank=comm.rank, size=comm.size, root=0)
    raises_everywhere(
        comm,
        mpisync.VerificationError,
        lambda: verify(comm, manifest, 0, lambda request: request.Wait()),
        f"rank {bad}: 'b'",
    )


@pytest.mark.parametrize("mixed", [False, True], ids=["bulk everywhere", "bulk beside general"])
def test_verification_of_a_bulk_set_names_rank_and_parameter(comm, mixed):
    """A dict of bare arrays is verified from its scan; ranks on the general path compare alike."""
    from mpisync._runtime.speedups import speedups
    from mpisync.params.bulk import BulkManifest, scan

    need_ranks(comm, 2)
    if speedups is None:  # the same in every rank of a pass
        pytest.skip("the bulk scan needs mpisync._speedups")
    bad = last_rank(comm)
    params = {n: values(n, 0, (8,), "int16") for n in ("a", "b", "c")}
    if mixed and comm.rank % 2 == 1:
        manifest = build_manifest(params, rank=comm.rank, size=comm.size, root=0)
    else:
        manifest = scan(params, rank=comm.rank, size=comm.size, root=0, devices=None, settings={})
        assert isinstance(manifest, BulkManifest)
    assert verify(comm, manifest, 0, lambda request: request.Wait()) == 1  # equal: one all-reduce
    if comm.rank == bad:
        params["b"][3] += 1
    raises_everywhere(
        comm,
        mpisync.VerificationError,
        lambda: verify(comm, manifest, 0, lambda request: request.Wait()),
        f"rank {bad}: 'b'",
    )


def test_verification_catches_local_replica_divergence(comm):
    params = {"a": [values("a", 0, (8,), "int16"), values("a", 0, (8,), "int16")]}
    params["a"][1][0] += 1
    manifest = build_manifest(params, rank=comm.rank, size=comm.size, root=0)
    expected = ", ".join(f"rank {r}: 'a'" for r in range(comm.size)).replace(", ", "; ")
    raises_everywhere(
        comm,
        mpisync.VerificationError,
        lambda: verify(comm if comm.size > 1 else None, manifest, 0, lambda r: r.Wait()),
        expected,
    )


def test_intercommunicator_is_refused(comm):
    need_ranks(comm, 2)
    local = comm.Split(color=comm.rank % 2, key=comm.rank)
    # leaders: world ranks 0 and 1
    inter = local.Create_intercomm(0, comm, 1 - comm.rank % 2, tag=7)
    try:
        with pytest.raises(mpisync.InvalidParamError, match="intercommunicator"):
            mpisync.sync_params({"w": np.zeros(2)}, inter)
    finally:
        inter.Free()
        local.Free()


@pytest.mark.parametrize("kind", ["nested tensor", "negative bit", "failing mapping"])
def test_input_that_raises_when_read_on_one_rank_raises_everywhere_at_once(comm, kind):
    # Whatever reading a rank's own input raises becomes the agreed error at once: the others never
    # wait for the timeout (60 s here).
    import time

    torch = pytest.importorskip("torch")
    bad = last_rank(comm)
    params = {"w": values("w", comm.rank, (4,), "float32"), "x": values("x", 0, (4,), "float32")}
    if comm.rank == bad:
        if kind == "nested tensor":
            params["x"] = torch.nested.nested_tensor([torch.ones(2), torch.ones(2)])
        elif kind == "negative bit":
            params["x"] = torch._neg_view(torch.ones(4))
        else:

            class Failing(dict):
                def __getitem__(self, key):
                    raise KeyError(f"{key} went missing")

            params = Failing(params)
    before = _snapshot({"w": params["w"]} if kind != "failing mapping" else {})
    start = time.monotonic()
    message = raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm, root=0, timeout=60),
        f"rank(s) {bad}",
    )
    assert time.monotonic() - start < 20
    assert ("raised" in message) and ("KeyError" in message or "parameter 'x'" in message)
    if kind != "failing mapping":
        _untouched({"w": params["w"]}, before)


@pytest.mark.parametrize(
    "devices, problem",
    [
        (["cuda:0"], "replica 0 is in host memory, but devices[0] is 'cuda:0'"),
        (["cpu:0", "cpu:1"], "has 1 replica(s), but devices lists 2"),
    ],
)
def test_a_single_array_is_checked_against_devices(comm, devices, problem):
    params = {"w": values("w", comm.rank, (4,), "float32")}
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm, root=0, devices=devices),
        problem,
    )


@pytest.mark.parametrize("setting", ["MPISYNC_CROSS_MEMORY", "MPISYNC_SPEEDUPS"])
@pytest.mark.parametrize("call", ["sync_params", "allreduce"])
def test_a_wire_setting_that_differs_between_ranks(comm, monkeypatch, setting, call):
    """A setting that changes what travels (a transport, the loops) is agreed with the manifest:
    one rank's other value is the same error on every rank, naming it, and nothing is written."""
    need_ranks(comm, 2)
    bad = last_rank(comm)
    monkeypatch.setenv(setting, "0" if comm.rank == bad else "1")
    params = _good(comm.rank)
    before = _snapshot(params)
    if call == "sync_params":
        run = lambda: mpisync.sync_params(params, comm)  # noqa: E731
    else:
        run = lambda: mpisync.allreduce(params, comm)  # noqa: E731
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        run,
        "ranks disagree on sync settings",
        f"{setting}: ",
        f"rank {bad}=False",
    )
    _untouched(params, before)
