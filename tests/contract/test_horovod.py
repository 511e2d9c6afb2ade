"""mpisync.horovod: Horovod's PyTorch API at 1-4 ranks (the singleton pass and mpiexec -n 2, 3, 4).

Reductions are checked against values every rank can compute: integers and halves, exact in
float32 whatever the order of the sum."""

import warnings

import numpy as np
import pytest

import mpisync

from mpiutil import last_rank, raises_everywhere

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("mpisync.horovod")

pytestmark = pytest.mark.mpi


@pytest.fixture
def started(comm):
    hvd.init(comm)
    yield comm
    hvd.shutdown()


def test_before_init_like_horovod():
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"has not been initialized; use hvd.init\(\)"):
        hvd.rank()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.allreduce(torch.ones(2))


def test_ranks_and_sizes(started):
    comm = started
    assert hvd.is_initialized() and (hvd.rank(), hvd.size()) == (comm.rank, comm.size)
    # one machine: every rank is local, one "node" across
    assert (hvd.local_rank(), hvd.local_size()) == (comm.rank, comm.size)
    assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
    assert hvd.mpi_enabled() and hvd.mpi_built() and not hvd.gloo_enabled()
    hvd.init()  # a second init is a no-op, as in Horovod
    assert hvd.size() == comm.size


def test_allreduce_ops_return_new_tensors(started):
    comm = started
    n, r = comm.size, comm.rank
    x = torch.tensor([r + 1.0, -2.0 * r, 0.5])
    kept = x.clone()
    ranks = np.arange(n, dtype=np.float32)
    average = hvd.allreduce(x, name="x")
    assert torch.equal(x, kept)  # the input is left as it is
    assert average.tolist() == [float((ranks + 1).mean()), float((-2 * ranks).mean()), 0.5]
    assert hvd.allreduce(x, average=False).tolist() == [
        float((ranks + 1).sum()),
        float((-2 * ranks).sum()),
        0.5 * n,
    ]
    assert hvd.allreduce(x, op=hvd.Sum).tolist() == hvd.allreduce(x, average=False).tolist()
    assert hvd.allreduce(x, op=hvd.Max)[0].item() == n and hvd.allreduce(x, op=hvd.Min)[0] == 1
    assert hvd.allreduce(torch.tensor([2.0]), op=hvd.Product).item() == 2.0**n
    scaled = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert torch.equal(scaled, hvd.allreduce(x, op=hvd.Sum))
    half = hvd.allreduce(x, compression=hvd.Compression.fp16)
    assert half.dtype == torch.float32 and torch.equal(half, average)


def test_allreduce_in_place_and_grouped(started):
    comm = started
    x = torch.full((3,), float(comm.rank))
    assert hvd.allreduce_(x, op=hvd.Sum) is x
    assert x.tolist() == [float(sum(range(comm.size)))] * 3
    a, b = torch.ones(2) * comm.rank, torch.arange(3.0)
    out = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    assert out[0].tolist() == [float(sum(range(comm.size)))] * 2
    assert out[1].tolist() == [0.0, 1.0 * comm.size, 2.0 * comm.size]
    handle = hvd.allreduce_async(torch.ones(1), name="h")
    assert not hvd.poll(handle)  # submitted: it runs once the ranks have matched it by name
    assert hvd.synchronize(handle).item() == 1.0 and hvd.poll(handle)


def test_unsupported_ops_are_named(started):
    with pytest.raises(ValueError, match="The op parameter supersedes average"):
        hvd.allreduce(torch.ones(1), average=True, op=hvd.Sum)
    with pytest.raises(AttributeError, match=r"does not provide elastic training \(hvd.elastic\)"):
        hvd.elastic.run  # noqa: B018
    with pytest.raises(AttributeError, match="does not provide Horovod's timeline"):
        hvd.start_timeline  # noqa: B018
    with pytest.raises(ImportError, match="Horovod's PyTorch API only"):
        import mpisync.horovod.tensorflow  # noqa: F401


def test_broadcast_tensors_and_objects(started):
    comm = started
    root = last_rank(comm)
    x = torch.full((2, 2), float(comm.rank))
    y = hvd.broadcast(x, root_rank=root, name="x")
    assert y.tolist() == [[float(root)] * 2] * 2 and x[0, 0].item() == comm.rank
    assert hvd.broadcast_(x, root) is x and x[0, 0].item() == root
    obj = {
        "epoch": 3 + comm.rank,
        "lr": np.float32(0.5),
        "names": ["a", ("b", None)],
        7: np.arange(4, dtype=np.int16) + comm.rank,
        "t": torch.tensor([1.5, 2.5]) * (comm.rank + 1),
    }
    got = hvd.broadcast_object(obj, root_rank=root, name="state")
    assert got["epoch"] == 3 + root and type(got["lr"]) is np.float32
    assert got["names"] == ["a", ("b", None)] and got[7].tolist() == [
        root,
        root + 1,
        root + 2,
        root + 3,
    ]
    assert got["t"].tolist() == [1.5 * (root + 1), 2.5 * (root + 1)]
    assert hvd.broadcast_object(None) is None


def test_broadcast_object_never_pickles(started):
    comm = started
    root = last_rank(comm)

    class Opaque:
        pass

    raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: hvd.broadcast_object(Opaque() if comm.rank == root else 0, root_rank=root),
        f"broadcast_object: rank {root}: cannot send an object of type",
        "never pickles",
    )


def test_broadcast_object_root_cannot_encode_a_meta_tensor(started):
    # Encoding fails on root with an error that is no TypeError/ValueError (a meta tensor has no
    # bytes): root's failure still travels in place of its object, and every rank raises it.
    comm = started
    root = last_rank(comm)
    meta = torch.empty(3, device="meta")
    message = raises_everywhere(
        comm,
        mpisync.InvalidParamError,
        lambda: hvd.broadcast_object({"w": meta} if comm.rank == root else None, root_rank=root),
        f"broadcast_object: rank {root}: cannot send",
    )
    assert "meta" in message.lower(), message


def test_allgather(started):
    comm = started
    x = torch.arange(comm.rank + 1, dtype=torch.int64).reshape(-1, 1) * 10
    got = hvd.allgather(x)
    assert got.shape == (sum(range(1, comm.size + 1)), 1)
    assert got[:, 0].tolist() == [10 * i for r in range(comm.size) for i in range(r + 1)]
    assert hvd.allgather_object({"rank": comm.rank}) == [{"rank": r} for r in range(comm.size)]
    assert hvd.allgather(torch.tensor(float(comm.rank))).tolist() == list(
        map(float, range(comm.size))
    )


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))


def test_distributed_optimizer_averages_gradients(started):
    comm = started
    model = _model(comm.rank)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.5)
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    for p in model.parameters():  # exact gradients: rank + 1 everywhere
        p.grad = torch.full_like(p, float(comm.rank + 1))
    opt.step()
    scheduler.step()
    mean = (comm.size + 1) / 2
    for p, b in zip(model.parameters(), before):
        assert torch.equal(p.grad, torch.full_like(p, mean))
        assert torch.equal(p.detach(), b - 0.5 * mean)
    assert opt.param_groups[0]["lr"] == 0.25 and sgd.param_groups[0]["lr"] == 0.25


def test_distributed_optimizer_missing_gradients_sum_and_synchronize(started):
    comm = started
    model = _model(0)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(),
        op=hvd.Sum,
    )
    first, second = model[0].weight, model[2].weight
    opt.zero_grad(set_to_none=True)
    first.grad = torch.ones_like(first) if comm.rank == 0 else None  # on rank 0 only
    opt.synchronize()  # e.g. to clip
    assert torch.equal(first.grad, torch.ones_like(first))  # the others count as zeros
    assert second.grad is None  # no rank has one: the optimizer skips it
    kept = second.detach().clone()
    with opt.skip_synchronize():
        opt.step()
    assert torch.equal(second.detach(), kept)
    opt.zero_grad()
    first.grad = torch.ones_like(first)
    opt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt.step()  # not reduced a second time: a sum would double
    assert "already reduced" in str(caught[0].message)
    assert torch.equal(first.grad, torch.full_like(first, float(comm.size)))


def test_distributed_optimizer_refusals(started):
    model = _model(0)
    sgd = torch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(ValueError, match="not in it"):
        hvd.DistributedOptimizer(sgd, named_parameters=list(model.named_parameters())[:1])
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)


def test_optimizer_state_from_root_with_horovods_signature(started):
    comm = started
    root = last_rank(comm)
    model = _model(comm.rank)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (comm.rank + 1))
    if comm.rank == root:  # only root has state, as after loading a checkpoint
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    hvd.broadcast_parameters(model.named_parameters(), root_rank=root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    state = opt.state_dict()
    assert list(state["state"]) == [0, 1, 2, 3]
    assert opt.param_groups[0]["lr"] == 0.01 * (root + 1)
    steps = [float(s["step"]) for s in state["state"].values()]
    assert steps == [1.0] * 4
