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


def test_pytree_arrays_in_place_and_root_scalars(comm):
    root = last_rank(comm)
    tree = _tree(comm.rank)
    if comm.rank % 2:
        tree = dict(reversed(list(tree.items())))  # insertion order may differ between ranks
    arrays = [tree["layers"][0]["w"], tree["layers"][0]["b"], tree["layers"][1]["w"], tree[7][0]]
    out = mpisync.sync_state(tree, comm, root=root)
    expected = _tree(root)
    for got, want in zip(arrays, [expected["layers"][0]["w"], expected["layers"][0]["b"],
                                  expected["layers"][1]["w"], expected[7][0]]):
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
        opt = torch.optim.Adam(model.parameters(), lr=1e-3 * (rank + 1), betas=(0.9, 0.99 - rank / 100))
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
    for name, tensor in ref_model.state_dict().items():
        assert same_bytes(model.state_dict()[name].numpy(), tensor.numpy()), name
    # One more step from identical states gives identical parameters everywhere.
    torch.manual_seed(7)
    batch = torch.randn(8, 6)
    for m, o in ((model, opt), (ref_model, ref_opt)):
        o.zero_grad()
        m(batch).pow(2).sum().backward()
        o.step()
    for name, tensor in ref_model.state_dict().items():
        assert same_bytes(model.state_dict()[name].numpy(), tensor.numpy()), name


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
    expected = {"extra-key": "layers.1: keys differ (missing here: []; not on root: ['extra'])",
                "array-vs-scalar": "layers.0.b: a non-array value here, an array on root",
                "list-length": "layers: length 3 here, 2 on root",
                "array-shape": "parameter 'layers.1.w' has shape (3, 3), root has (2, 2)"}[kind]
    raises_everywhere(comm, mpisync.ManifestMismatchError, lambda: mpisync.sync_state(tree, comm, root=0),
                      f"rank {bad}", expected)
    assert same_bytes(tree["layers"][0]["w"], before[0])


def test_unsupported_leaf_is_refused_everywhere(comm):
    bad = last_rank(comm)
    tree = _tree(comm.rank)
    if comm.rank == bad:
        tree["oops"] = {1, 2}
    raises_everywhere(comm, mpisync.InvalidParamError, lambda: mpisync.sync_state(tree, comm),
                      f"rank {bad}: oops: unsupported leaf of type builtins.set")
