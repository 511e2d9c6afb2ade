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


def test_sync_batch_norm_is_batch_norm_over_every_ranks_batch(started):
    comm = started
    torch.manual_seed(0)
    full = torch.randn(2 * comm.size, 3, 4, dtype=torch.float64)
    mine = full[2 * comm.rank : 2 * comm.rank + 2].clone().requires_grad_()
    whole = full.clone().requires_grad_()
    sync_bn = hvd.SyncBatchNorm(3).double()
    bn = torch.nn.BatchNorm1d(3).double()
    out, reference = sync_bn(mine), bn(whole)
    assert torch.allclose(out, reference[2 * comm.rank : 2 * comm.rank + 2], atol=1e-12)
    assert torch.allclose(sync_bn.running_mean, bn.running_mean, atol=1e-12)
    assert torch.allclose(sync_bn.running_var, bn.running_var, atol=1e-12)
    weights = torch.arange(full.numel(), dtype=torch.float64).reshape(full.shape)
    (out * weights[2 * comm.rank : 2 * comm.rank + 2]).sum().backward()
    (reference * weights).sum().backward()
    assert torch.allclose(mine.grad, whole.grad[2 * comm.rank : 2 * comm.rank + 2], atol=1e-9)
    summed = hvd.allreduce(sync_bn.weight.grad, op=hvd.Sum)
    assert torch.allclose(summed, bn.weight.grad, atol=1e-9)
    sync_bn.eval()
    assert torch.allclose(sync_bn(mine), bn.eval()(whole)[2 * comm.rank : 2 * comm.rank + 2])
