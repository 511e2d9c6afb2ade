"""sync_state: nested training state, arrays in place, other leaves take root's values."""

import math

import numpy as np
import pytest

import mpisync

from mpiutil import last_rank, need_ranks, raises_everywhere, same_bytes, values

pytestmark = pytest.mark.mpi


def _tree(rank):
    return {
        "step": rank + 10,
        "lr": 0.1 * (rank + 1),
        "name": f"run-{rank}",
        "flags": (rank % 2 == 0, None, float("inf") if rank == 0 else -float("inf"), float("nan")),
        "layers": [
            {"w": values("w0", rank, (3, 4), "float32"), "b": values("b0", rank, (4,), "float16")},
            {"w": values("w1", rank, (2, 2), "float64"), "scale": np.float32(rank)},
        ],
        7: (values("t", rank, (5,), "int32"), "tuple-sibling"),
    }


def _same_parameters(model, ref_model) -> None:
    for name, tensor in ref_model.state_dict().items():
        assert same_bytes(model.state_dict()[name].numpy(), tensor.numpy()), name


def _one_more_step_agrees(torch, batch_shape, mine, ref, seed) -> None:
    """One more step of ``mine`` and ``ref`` ((model, optimizer) pairs in identical states) on one
    batch leaves identical parameters."""
    torch.manual_seed(seed)
    batch = torch.randn(*batch_shape)
    for m, o in (mine, ref):
        o.zero_grad()
        m(batch).pow(2).sum().backward()
        o.step()
    _same_parameters(mine[0], ref[0])


def test_pytree_arrays_in_place_and_root_scalars(comm):
    root = last_rank(comm)
    tree = _tree(comm.rank)
    if comm.rank % 2:
        tree = dict(reversed(list(tree.items())))  # insertion order may differ between ranks
    arrays = [tree["layers"][0]["w"], tree["layers"][0]["b"], tree["layers"][1]["w"], tree[7][0]]
    out = mpisync.sync_state(tree, comm, root=root)
    expected = _tree(root)
    for got, want in zip(
        arrays,
        [
            expected["layers"][0]["w"],
            expected["layers"][0]["b"],
            expected["layers"][1]["w"],
            expected[7][0],
        ],
    ):
        assert same_bytes(got, want)
    assert out["layers"][0]["w"] is arrays[0] and out[7][0] is arrays[3]
    assert out["step"] == root + 10 and type(out["step"]) is int
    assert out["lr"] == 0.1 * (root + 1) and out["name"] == f"run-{root}"
    flags = out["flags"]
    assert type(flags) is tuple and flags[0] is (root % 2 == 0) and flags[1] is None
    assert flags[2] == (math.inf if root == 0 else -math.inf) and math.isnan(flags[3])
    assert out["layers"][1]["scale"] == float(root) and out[7][1] == "tuple-sibling"
    assert list(out) == list(tree)  # each rank keeps its own key order


def test_torch_adam_state_after_a_step(comm):
    torch = pytest.importorskip("torch")

    def trained(rank):
        torch.manual_seed(100 + rank)
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))
        opt = torch.optim.Adam(
            model.parameters(), lr=1e-3 * (rank + 1), betas=(0.9, 0.99 - rank / 100)
        )
        for _ in range(rank + 1):
            opt.zero_grad()
            model(torch.randn(8, 6)).pow(2).sum().backward()
            opt.step()
        return model, opt

    root = comm.size // 2
    model, opt = trained(comm.rank)
    mpisync.sync_params(model.state_dict(), comm, root=root)
    synced = mpisync.sync_state(opt.state_dict(), comm, root=root, verify=True)
    opt.load_state_dict(synced)
    ref_model, ref_opt = trained(root)
    mine, ref = opt.state_dict(), ref_opt.state_dict()
    assert mine["param_groups"][0]["lr"] == ref["param_groups"][0]["lr"]
    assert mine["param_groups"][0]["betas"] == ref["param_groups"][0]["betas"]
    for index, state in ref["state"].items():
        for key, tensor in state.items():
            assert same_bytes(mine["state"][index][key].numpy(), tensor.numpy()), (index, key)
    _same_parameters(model, ref_model)
    _one_more_step_agrees(torch, (8, 6), (model, opt), (ref_model, ref_opt), seed=7)


@pytest.mark.parametrize("kind", ["extra-key", "array-vs-scalar", "list-length", "array-shape"])
def test_structure_mismatch_names_the_path(comm, kind):
    need_ranks(comm, 2)
    bad = last_rank(comm)
    tree = _tree(comm.rank)
    if comm.rank == bad:
        if kind == "extra-key":
            tree["layers"][1]["extra"] = 3
        elif kind == "array-vs-scalar":
            tree["layers"][0]["b"] = 1.5
        elif kind == "list-length":
            tree["layers"].append({})
        else:
            tree["layers"][1]["w"] = np.zeros((3, 3))
    before = [np.array(tree["layers"][0]["w"], copy=True)]
    expected = {
        "extra-key": "layers.1: keys differ (missing here: []; not on root: ['extra'])",
        "array-vs-scalar": "layers.0.b: a non-array value here, an array on root",
        "list-length": "layers: length 3 here, 2 on root",
        "array-shape": "parameter 'layers.1.w' has shape (3, 3), root has (2, 2)",
    }[kind]
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.sync_state(tree, comm, root=0),
        f"rank {bad}",
        expected,
    )
    assert same_bytes(tree["layers"][0]["w"], before[0])


def test_unsupported_leaf_is_refused_everywhere(comm):
    bad = last_rank(comm)
    tree = _tree(comm.rank)
    if comm.rank == bad:
        tree["oops"] = {1, 2}
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_state(tree, comm),
        f"rank {bad}: oops: unsupported leaf of type builtins.set",
    )


def _numpy_scalars(r: int) -> dict:
    """Numpy scalars of six types whose values depend on the rank ``r``."""
    return {
        "f32": np.float32(1.5 + r),
        "f16": np.float16(0.1 * (r + 1)),
        "i8": np.int8(-3 - r),
        "u64": np.uint64(2**63 + r),
        "b": np.bool_(r % 2 == 0),
        "c64": np.complex64(1 + 2j * r),
    }


def test_numpy_scalar_types_are_kept_exactly(comm):
    root = last_rank(comm)
    r = comm.rank
    tree = {
        **_numpy_scalars(r),
        "ld": np.longdouble(1) / (3 + r),
        "py": (1.5 + r, r, 2j + r),
    }
    out = mpisync.sync_state(tree, comm, root=root)
    expected = _numpy_scalars(root)
    for key, want in expected.items():
        assert type(out[key]) is type(want) and out[key].tobytes() == want.tobytes(), (
            key,
            out[key],
            want,
        )
    # not cut to a float
    assert type(out["ld"]) is np.longdouble and out["ld"] == np.longdouble(1) / (3 + root)
    assert out["py"] == (1.5 + root, root, 2j + root) and type(out["py"][2]) is complex


@pytest.mark.parametrize("kind", ["cycle", "deep-5000", "deep-list"])
def test_cyclic_or_too_deep_tree_on_one_rank_is_refused_everywhere(comm, kind):
    bad = last_rank(comm)
    weights = values("w", comm.rank, (4,), "float32")
    before = weights.copy()
    tree = {"w": weights, "sub": {"x": 1}}
    if comm.rank == bad:
        if kind == "cycle":
            tree["sub"]["again"] = tree
        else:
            node = tree["sub"]
            for _ in range(5000):
                node["k"] = [{}] if kind == "deep-list" else {}
                node = node["k"][0] if kind == "deep-list" else node["k"]
    expected = (
        "sub.again: the tree contains itself (a cycle)"
        if kind == "cycle"
        else f"the tree nests deeper than {mpisync.state.MAX_DEPTH} levels"
    )
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_state(tree, comm, root=0),
        f"rank {bad}",
        expected,
    )
    assert same_bytes(weights, before)  # nothing was written


def _model_and_optimizer(torch, rank, steps):
    torch.manual_seed(300 + rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3 * (rank + 1), weight_decay=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(6, 5)).pow(2).sum().backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("form", ["state_dict", "named_parameters", "generator", "list"])
def test_broadcast_parameters_takes_horovod_forms(comm, form):
    torch = pytest.importorskip("torch")
    root = comm.size // 2
    model, _ = _model_and_optimizer(torch, comm.rank, 0)
    ref, _ = _model_and_optimizer(torch, root, 0)
    params = {
        "state_dict": lambda: model.state_dict(),
        "named_parameters": lambda: model.named_parameters(),
        "generator": lambda: ((n, p) for n, p in model.state_dict().items()),
        "list": lambda: list(model.named_parameters()),
    }[form]()
    assert mpisync.broadcast_parameters(params, root_rank=root, comm=comm) is None
    names = (
        ref.state_dict() if form in ("state_dict", "generator") else dict(ref.named_parameters())
    )
    for name, tensor in names.items():
        assert same_bytes(model.state_dict()[name].detach().numpy(), tensor.detach().numpy()), name


def test_broadcast_parameters_refuses_non_pairs_everywhere(comm):
    bad = last_rank(comm)
    weights = values("w", comm.rank, (3,), "float64")
    params = {"w": weights} if comm.rank != bad else [("w", weights), "oops"]
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.broadcast_parameters(params, root_rank=0, comm=comm),
        f"rank {bad}: item 1 of params is not a (name, tensor) pair: str",
    )


@pytest.mark.parametrize("root_steps", [1, 3])
def test_broadcast_optimizer_state_fills_ranks_without_state(comm, root_steps):
    torch = pytest.importorskip("torch")
    root = last_rank(comm)
    # Resume: only root has state (it loaded a checkpoint); rank 0 (when not root) has stepped once.
    model, opt = _model_and_optimizer(
        torch, comm.rank, root_steps if comm.rank == root else int(comm.rank == 0)
    )
    mpisync.broadcast_parameters(model.state_dict(), root_rank=root, comm=comm)
    mpisync.broadcast_optimizer_state(opt, root_rank=root, comm=comm)
    ref_model, ref_opt = _model_and_optimizer(torch, root, root_steps)
    mine, ref = opt.state_dict(), ref_opt.state_dict()
    assert mine["param_groups"] == ref["param_groups"]
    assert list(mine["state"]) == list(ref["state"])  # root's order too
    for index, state in ref["state"].items():
        assert list(mine["state"][index]) == list(state)
        for key, tensor in state.items():
            got = mine["state"][index][key]
            assert got.dtype == tensor.dtype and same_bytes(got.numpy(), tensor.numpy()), (
                index,
                key,
            )
    _one_more_step_agrees(torch, (6, 5), (model, opt), (ref_model, ref_opt), seed=9)


def test_broadcast_optimizer_state_local_failure_is_agreed(comm):
    torch = pytest.importorskip("torch")
    root = 0
    model, opt = _model_and_optimizer(torch, comm.rank, 2 if comm.rank == root else 0)
    if comm.rank == last_rank(comm):
        calls = []
        real = opt.state_dict

        # describing works; building root's structure then fails here alone
        def failing_second_call():
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("state_dict failed on this rank")
            return real()

        opt.state_dict = failing_second_call
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.broadcast_optimizer_state(opt, root_rank=root, comm=comm),
        f"rank {last_rank(comm)}",
        "state_dict failed on this rank",
    )


def test_optimizer_state_only_on_root_points_to_broadcast_optimizer_state(comm):
    # The usual resume: root loaded the optimizer's state, the others have none yet. sync_state
    # needs one structure everywhere: its error says which call fills the others in.
    torch = pytest.importorskip("torch")
    need_ranks(comm, 2)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if comm.rank == 0:
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    others = (
        "rank 1"
        if comm.size == 2
        else f"ranks 1-{comm.size - 1}"
        if comm.size > 3
        else "ranks 1, 2"
    )
    raises_everywhere(
        comm,
        mpisync.ManifestMismatchError,
        lambda: mpisync.sync_state(opt.state_dict(), comm, root=0),
        f"state tree structure differs from root rank 0's: {others}: state: keys differ "
        "(missing here: [0, 1]; not on root: []); only root has entries here: if this is a torch "
        "optimizer's state that only root loaded (or only root stepped), use "
        "mpisync.broadcast_optimizer_state(optimizer, root_rank=...), which first gives every "
        "rank root's structure",
    )
    mpisync.broadcast_optimizer_state(opt, root_rank=0, comm=comm)  # the call it names: works
    assert list(opt.state_dict()["state"]) == [0, 1]


def test_broadcast_optimizer_state_takes_horovods_forms(comm):
    torch = pytest.importorskip("torch")
    root = last_rank(comm)

    def make():
        torch.manual_seed(comm.rank)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (comm.rank + 1), momentum=0.9)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        return opt

    expected = 0.1 * (root + 1)
    for call in (
        lambda opt: mpisync.broadcast_optimizer_state(opt, root),  # Horovod: positional
        lambda opt: mpisync.broadcast_optimizer_state(opt, root_rank=root, comm=comm),
        lambda opt: mpisync.broadcast_optimizer_state(opt, root=root),  # the older keyword
    ):
        opt = make()
        call(opt)
        assert opt.param_groups[0]["lr"] == expected
    opt = make()
    with pytest.warns(DeprecationWarning, match="older form"):
        mpisync.broadcast_optimizer_state(opt, comm, root=root)  # the older positional comm
    assert opt.param_groups[0]["lr"] == expected
    with pytest.raises(mpisync.InvalidParamError, match="root_rank=1 and root=2 differ"):
        mpisync.broadcast_optimizer_state(opt, 1, root=2)


class _Picky(dict):
    """A mapping type whose constructor refuses on one rank only (a user's validating type)."""

    refuse = False

    def __init__(self, *args):
        if _Picky.refuse and args:
            raise ValueError("this rank's config refuses the rebuilt entries")
        super().__init__(*args)


def test_a_rebuild_that_fails_on_one_rank_is_the_same_error_everywhere_nothing_written(comm):
    need_ranks(comm, 2)
    bad = comm.size - 1
    weights = values("w", comm.rank, (64,), "float32")
    before = weights.copy()
    tree = {"model": {"w": weights}, "config": _Picky([("lr", 0.1 * (comm.rank + 1))])}
    _Picky.refuse = comm.rank == bad
    try:
        raises_everywhere(
            comm,
            mpisync.InvalidParamError,
            lambda: mpisync.sync_state(tree, comm),
            f"rank {bad}: cannot rebuild the tree with root's values: ValueError: this rank's "
            "config refuses the rebuilt entries",
        )
    finally:
        _Picky.refuse = False
    assert same_bytes(weights, before), "an array was written though the sync was refused"
    result = mpisync.sync_state(tree, comm)  # the same tree, every rank able: root's values
    assert result["config"] == {"lr": 0.1} and type(result["config"]) is _Picky
    assert same_bytes(weights, values("w", 0, (64,), "float32"))
