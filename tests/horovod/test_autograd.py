"""The collectives are differentiable with Horovod's gradients."""

import pytest

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi


def test_allreduce_grad_is_the_allreduce_of_the_gradient(started):
    comm = started
    x = torch.ones(3, requires_grad=True)
    (hvd.allreduce(x * 2, op=hvd.Sum) * (comm.rank + 1)).sum().backward()
    assert x.grad.tolist() == [2.0 * sum(range(1, comm.size + 1))] * 3
    y = torch.ones(2, requires_grad=True)
    (a,) = hvd.grouped_allreduce([y])
    a.sum().backward()
    assert y.grad.tolist() == [1.0, 1.0]  # average of ones


def test_allgather_grad_is_this_ranks_rows_of_the_averaged_gradient(started):
    comm = started
    x = torch.ones(comm.rank + 1, 2, requires_grad=True)
    gathered = hvd.allgather(x)
    weights = torch.arange(gathered.shape[0], dtype=torch.float32).reshape(-1, 1)
    (gathered * weights).sum().backward()
    start = sum(range(1, comm.rank + 1))
    assert x.grad[:, 0].tolist() == [float(start + i) for i in range(comm.rank + 1)]


def test_broadcast_grad_reaches_the_root_only(started):
    comm = started
    root = comm.size - 1
    x = torch.ones(2, requires_grad=True)
    hvd.broadcast(x, root_rank=root).sum().backward()
    assert x.grad.tolist() == ([1.0, 1.0] if comm.rank == root else [0.0, 0.0])


def test_alltoall_grad_goes_back_along_the_splits(started):
    comm = started
    x = torch.ones(comm.size * (comm.rank + 1), requires_grad=True)
    out, _ = hvd.alltoall(x, splits=[comm.rank + 1] * comm.size)
    (out * 3).sum().backward()
    assert x.grad.tolist() == [3.0] * x.numel()


def test_reducescatter_grad_is_the_allgather_of_the_gradient(started):
    comm = started
    x = torch.ones(2 * comm.size, 1, requires_grad=True)
    out = hvd.reducescatter(x, op=hvd.Sum)
    (out * (comm.rank + 1)).sum().backward()
    expected = [float((r + 1) * comm.size) for r in range(comm.size) for _ in range(2)]
    assert x.grad[:, 0].tolist() == expected
