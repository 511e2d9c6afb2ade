"""torch CPU tensors: a model's state_dict (BatchNorm buffers included) syncs as is."""

import numpy as np
import pytest

import mpisync

from mpiutil import last_rank, need_ranks, raises_everywhere

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")  # installed on every rank or on none


def _trained_model(rank: int):
    """A small conv net whose weights and BatchNorm statistics depend on ``rank``."""
    torch.manual_seed(1234 + rank)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 10, dtype=torch.float32),
    )
    model.train()
    model(torch.randn(4, 3, 8, 8))  # updates running_mean, running_var, num_batches_tracked
    model.half_head = torch.nn.Linear(3, 2).to(torch.bfloat16)
    return model


def _raw(t):
    return t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def test_state_dict_with_batchnorm_buffers(comm):
    root = last_rank(comm)
    model = _trained_model(comm.rank)
    state = model.state_dict()
    assert "1.num_batches_tracked" in state and state["1.num_batches_tracked"].dim() == 0
    report = mpisync.sync_params(state, comm, root=root, verify=True)
    expected = _trained_model(root).state_dict()
    assert report.tensors == len(expected)
    for name, tensor in model.state_dict().items():
        assert _raw(tensor) == _raw(expected[name]), name
    assert model.state_dict()["half_head.weight"].dtype == torch.bfloat16


def test_parameters_requiring_grad_are_written_in_place(comm):
    model = _trained_model(comm.rank)
    params = dict(model.named_parameters())
    weight = params["0.weight"]
    assert weight.requires_grad
    mpisync.sync_params(params, comm, root=0)
    assert _raw(weight) == _raw(_trained_model(0).state_dict()["0.weight"])


def test_torch_and_numpy_replicas_mix(comm):
    master = torch.full((6,), float(comm.rank), dtype=torch.float32)
    mirror = np.zeros(6, np.float32)
    mpisync.sync_params({"w": [master, mirror]}, comm, root=0)
    assert master.tolist() == [0.0] * 6 and mirror.tolist() == [0.0] * 6


def test_non_contiguous_tensor_is_refused_everywhere(comm):
    need_ranks(comm, 2)
    bad = last_rank(comm)
    w = torch.zeros(4, 4)
    params = {"w": w.t() if comm.rank == bad else w.clone()}
    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: mpisync.sync_params(params, comm),
        f"rank {bad}: parameter 'w'",
        "not contiguous",
    )


def _float_model(rank: int):
    torch.manual_seed(99 + rank)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.BatchNorm1d(7), torch.nn.Linear(7, 3)
    )
    model.train()
    model(torch.randn(6, 5))
    return model


def test_state_dict_rank_paths_mixed_and_re_pointed_between_syncs(comm):
    # A state_dict of CPU tensors numpy can view takes the bulk path (through Tensor.numpy());
    # here odd ranks hold one-replica lists, which take the general path. Digests and collectives
    # must match, and a tensor re-pointed on one rank between two syncs of the same dict must be
    # seen there (its new memory written, its old memory left alone).
    root = last_rank(comm)
    state = _float_model(comm.rank).state_dict()
    params = state if comm.rank % 2 == 0 else {name: [t] for name, t in state.items()}
    expected = {name: _raw(t) for name, t in _float_model(root).state_dict().items()}
    with mpisync.ParamSync(comm, root=root) as syncer:
        syncer.sync(params, verify=True)
        assert {name: _raw(t) for name, t in state.items()} == expected
        old = state["0.weight"].data
        if comm.rank == root:
            state["0.weight"].add_(1.0)
        elif comm.rank == 0:
            state["0.weight"].data = torch.full((7, 5), -1.0)  # the same object, new memory
        expected["0.weight"] = _raw(_float_model(root).state_dict()["0.weight"] + 1.0)
        syncer.sync(params, verify=True)
        assert {name: _raw(t) for name, t in state.items()} == expected
        if comm.rank == 0 and comm.rank != root:
            # not written again
            assert _raw(old) == _raw(_float_model(root).state_dict()["0.weight"])
