"""DistributedOptimizer's step, broadcast_parameters and broadcast_optimizer_state are operations
of the engine, matched by name with the ranks' other operations: mixed with named async
operations in any order they give the right values, and ranks that issue different operations
get the same error at once instead of a wait."""

import time

import pytest

from mpiutil import raises_everywhere

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi

FAST_SECONDS = 20.0  # far below the timeout


def model_and_optimizer(comm):
    model = torch.nn.Linear(3, 2, bias=False)
    torch.nn.init.constant_(model.weight, 1.0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0), named_parameters=model.named_parameters()
    )
    model(torch.full((1, 3), float(comm.rank + 1))).sum().backward()  # grad: rank + 1
    return model, opt


def test_optimizer_step_and_a_named_async_op_in_either_order(started):
    comm = started
    model, opt = model_and_optimizer(comm)
    x = torch.full((2,), float(comm.rank))
    if comm.rank % 2 == 0:
        handle = hvd.allreduce_async(x, name="beside", op=hvd.Sum)
        opt.step()
    else:
        opt.step()
        handle = hvd.allreduce_async(x, name="beside", op=hvd.Sum)
    assert hvd.synchronize(handle).tolist() == [float(sum(range(comm.size)))] * 2
    mean_grad = sum(range(1, comm.size + 1)) / comm.size
    assert model.weight.detach().tolist() == [[1.0 - mean_grad] * 3] * 2


def test_broadcasts_and_named_async_ops_in_either_order(started):
    comm = started
    model = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(model.weight, float(comm.rank))
    opt = torch.optim.SGD(model.parameters(), lr=0.5 + comm.rank)
    x = torch.ones(3)
    if comm.rank % 2 == 0:
        handle = hvd.allreduce_async(x, name="beside", op=hvd.Sum)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    else:
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        handle = hvd.allreduce_async(x, name="beside", op=hvd.Sum)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert hvd.synchronize(handle).tolist() == [float(comm.size)] * 3
    assert model.weight.detach().tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert opt.param_groups[0]["lr"] == 0.5


@pytest.mark.parametrize("call", ["broadcast_parameters", "broadcast_optimizer_state", "step"])
def test_one_rank_in_a_broadcast_or_step_the_other_in_an_allreduce_raise_at_once(started, call):
    comm = started
    if comm.size == 1:
        pytest.skip("needs two ranks")
    model, opt = model_and_optimizer(comm)
    calls = {
        "broadcast_parameters": lambda: hvd.broadcast_parameters(model.state_dict(), 0),
        "broadcast_optimizer_state": lambda: hvd.broadcast_optimizer_state(opt, 0),
        "step": opt.step,
    }
    mine = calls[call] if comm.rank == 0 else lambda: hvd.allreduce(torch.ones(1), name="other")
    start = time.monotonic()
    raises_everywhere(
        comm, hvd.HorovodInternalError, mine, "the ranks wait for different operations"
    )
    assert time.monotonic() - start < FAST_SECONDS
    model.weight.data.fill_(float(comm.rank))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)  # the engine goes on
    assert model.weight.detach().tolist() == [[0.0] * 3] * 2
    opt.step()  # grad: rank + 1, averaged
    assert model.weight.detach().tolist() == [[-sum(range(1, comm.size + 1)) / comm.size] * 3] * 2
