"""alltoall, reducescatter, grouped allgather, scaling in Horovod's arithmetic; values
checked exactly (integers and halves)."""

import pytest

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

from mpisync.transports import policy  # noqa: E402

from mpiutil import taken  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(params=["peer to peer", "one Ialltoallv"])
def alltoall_path(request, monkeypatch):
    """Each path of ``alltoall``: messages per peer, and the one for larger sets (forced on every
    rank alike)."""
    if request.param == "one Ialltoallv":
        monkeypatch.setattr(policy, "PAIRWISE_MAX_RANKS", 0)
    return request.param


def test_alltoall_with_splits(started, alltoall_path):
    comm = started
    n, r = comm.size, comm.rank
    # rank r sends i+1 rows to rank i, each row holding 100*r + i
    rows = [torch.full((i + 1, 2), 100.0 * r + i) for i in range(n)]
    out, received = hvd.alltoall(torch.cat(rows), splits=torch.tensor([i + 1 for i in range(n)]))
    assert received.tolist() == [r + 1] * n and received.dtype == torch.int32
    assert out[:, 0].tolist() == [100.0 * j + r for j in range(n) for _ in range(r + 1)]
    equal = hvd.alltoall(torch.arange(2 * n) + 1000 * r)
    assert equal.tolist() == [1000 * j + 2 * r + k for j in range(n) for k in range(2)]


def test_alltoall_of_some_rows_and_none_to_some_ranks(started, alltoall_path):
    """Rank ``r`` sends rank ``i`` ``(r + 2 i) % 3`` rows of a non-contiguous tensor (none to
    some ranks), and keeps two rows it sends nobody."""
    comm = started
    n, r = comm.size, comm.rank
    splits = [(r + 2 * i) % 3 for i in range(n)]
    blocks = [
        torch.arange(k * 3, dtype=torch.float64).reshape(k, 3) + 100 * r + 10 * i
        for i, k in enumerate(splits)
    ]
    rows = torch.cat([*blocks, torch.full((2, 3), -1.0, dtype=torch.float64)])
    wide = torch.zeros(rows.shape[0], 6, dtype=torch.float64)
    wide[:, ::2] = rows
    out, received = hvd.alltoall(wide[:, ::2], splits=splits)
    got = [(j + 2 * r) % 3 for j in range(n)]
    assert received.tolist() == got
    expected = torch.cat(
        [
            torch.arange(k * 3, dtype=torch.float64).reshape(k, 3) + 100 * j + 10 * r
            for j, k in enumerate(got)
        ]
    )
    assert torch.equal(out, expected)


def test_reducescatter_uneven_rows_and_ops(started):
    comm = started
    n, r = comm.size, comm.rank
    rows = 2 * n + 1
    x = torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) * (r + 1)
    got = hvd.reducescatter(x, op=hvd.Sum)
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    start = sum(counts[:r])
    total = sum(range(1, n + 1))
    expected = torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2)[start:][: counts[r]]
    assert torch.equal(got, expected * total)
    assert torch.equal(hvd.reducescatter(x), expected * total / n)  # Average, Horovod's default
    a, b = hvd.grouped_reducescatter([x, x[:, :1] * 2], op=hvd.Sum)
    assert torch.equal(a, got) and torch.equal(b, got[:, :1] * 2)


def test_grouped_allgather_variable_rows(started):
    comm = started
    xs = [torch.full((comm.rank + 1, 3), comm.rank, dtype=torch.int16), torch.ones(1) * comm.rank]
    a, b = hvd.grouped_allgather(xs)
    assert a[:, 0].tolist() == [j for j in range(comm.size) for _ in range(j + 1)]
    assert a.dtype == torch.int16 and b.tolist() == [float(j) for j in range(comm.size)]


def test_integer_prescale_and_postscale_as_horovod(started):
    comm = started
    x = torch.tensor([7, -7, 3], dtype=torch.int32)
    pre = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5)  # each rank: trunc(x * 0.5)
    assert pre.tolist() == [3 * comm.size, -3 * comm.size, 1 * comm.size]
    post = hvd.allreduce(x, op=hvd.Sum, postscale_factor=0.5)
    assert post.dtype == torch.int32
    assert post.tolist() == [
        int(7 * comm.size * 0.5),
        int(-7 * comm.size * 0.5),
        int(1.5 * comm.size),
    ]
    half = hvd.allreduce(torch.tensor([1.5], dtype=torch.float16), op=hvd.Sum, prescale_factor=2.0)
    assert half.dtype == torch.float16 and half.item() == 3.0 * comm.size


def test_barrier_runs_what_every_rank_submitted(started):
    comm = started
    b = hvd.broadcast_async(torch.full((2,), float(comm.rank)), root_rank=0)
    g = hvd.allgather_async(torch.tensor([comm.rank]))
    hvd.barrier()
    assert hvd.poll(b) and hvd.poll(g)
    assert hvd.synchronize(b).tolist() == [0.0, 0.0]
    assert hvd.synchronize(g).tolist() == list(range(comm.size))


def test_sparse_allreduce_is_the_dense_one(started):
    comm = started
    dense = torch.zeros(5, 3)
    dense[comm.rank % 5] = comm.rank + 1.0
    dense[4] = 2.0
    handle = hvd.sparse_allreduce_async(dense.to_sparse(), name="s", op=hvd.Average)
    assert torch.equal(handle().to_dense(), hvd.allreduce(dense))


def test_sparse_gradients_in_distributed_optimizer(started):
    comm = started
    embedding = torch.nn.Embedding(6, 2, sparse=True)
    torch.nn.init.zeros_(embedding.weight)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0), op=hvd.Sum)
    embedding(torch.tensor([comm.rank % 6, 5])).sum().backward()
    assert embedding.weight.grad.is_sparse
    opt.step()
    expected = torch.zeros(6, 2)
    for r in range(comm.size):
        expected[r % 6] -= 1.0
    expected[5] -= comm.size
    assert torch.equal(embedding.weight.detach(), expected)


def test_broadcast_optimizer_state_gives_zero_grads_as_horovod(started):
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    trained = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([frozen, trained], lr=0.1, momentum=0.9)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert frozen.grad is None and torch.equal(trained.grad, torch.zeros(3))


def test_sparse_as_dense_gives_sparse_gradients_back(started):
    comm = started
    embedding = torch.nn.Embedding(4, 1, sparse=True)
    torch.nn.init.zeros_(embedding.weight)
    opt = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(list(embedding.parameters()), lr=0.1),
        named_parameters=embedding.named_parameters(),
        sparse_as_dense=True,
        op=hvd.Sum,
    )
    assert list(opt._parameter_names.values()) == ["weight"]
    embedding(torch.tensor([comm.rank % 4])).sum().backward()
    opt.step()  # SparseAdam refuses dense gradients: the reduced one is sparse again
    grad = embedding.weight.grad.coalesce()
    assert grad.is_sparse
    assert grad.sparse_dim() == 1  # as the embedding gave it
    dense = torch.zeros(4, 1).index_add_(0, grad.indices()[0], grad.values())
    counts = [float(sum(1 for r in range(comm.size) if r % 4 == i)) for i in range(4)]
    assert dense[:, 0].tolist() == counts


def test_objects_may_be_sets(started):
    comm = started
    got = hvd.allgather_object({"rank", comm.rank})
    assert got == [{"rank", r} for r in range(comm.size)]
    assert hvd.broadcast_object(frozenset({1, 2})) == frozenset({1, 2})


def _values(rank: int, n: int, exact: bool):
    import numpy as np

    rng = np.random.default_rng(rank)
    values = rng.integers(-9, 9, n) if exact else rng.standard_normal(n)
    return values.astype(np.float32)


def test_a_large_allreduce_has_mpis_bytes(started):
    """From ``MIN_BYTES`` the reduction reads the peers' memory on one node: MPI's bytes at two
    ranks, the same exact integers at more."""
    import numpy as np
    from mpi4py import MPI

    from mpisync.transports.policy import CROSS_REDUCE_MIN_BYTES as MIN_BYTES

    comm = started
    n, exact = MIN_BYTES // 4 + 3, comm.size > 2
    x = torch.from_numpy(_values(comm.rank, n, exact))
    expected = x.numpy().copy()
    comm.Allreduce(MPI.IN_PLACE, expected)
    assert hvd.allreduce(x, op=hvd.Sum).numpy().tobytes() == expected.tobytes()
    largest = np.maximum.reduce([_values(r, n, exact) for r in range(comm.size)])
    assert hvd.allreduce(x, op=hvd.Max).numpy().tobytes() == largest.tobytes()


def test_a_mid_size_allreduce_has_mpis_bytes(started):
    """256 KiB to 2 MiB: MPI's bytes at two ranks, the same exact integers at more, every call."""
    import numpy as np
    from mpi4py import MPI

    comm = started
    n, exact = (2 << 20) // 16 + 3, comm.size > 2
    for round_ in range(3):
        x = torch.from_numpy(_values(comm.rank + 10 * round_, n, exact))
        expected = x.numpy().copy()
        comm.Allreduce(MPI.IN_PLACE, expected)
        assert hvd.allreduce(x, op=hvd.Sum).numpy().tobytes() == expected.tobytes(), round_
        values = [_values(r + 10 * round_, n, exact) for r in range(comm.size)]
        largest = np.maximum.reduce(values)
        assert hvd.allreduce(x, op=hvd.Max).numpy().tobytes() == largest.tobytes(), round_


def _spied(monkeypatch, name: str) -> list:
    """Whether each call of cross-memory's step generator ``name`` ran its path."""
    from mpisync.transports import crossreduce

    return taken(monkeypatch, crossreduce, name)


@pytest.mark.parametrize("rows", ["equal", "uneven"])
def test_a_large_reducescatter_has_the_blocks_of_mpis_allreduce(started, monkeypatch, rows):
    """From ``MIN_BYTES`` with equal rows each rank reduces its block from its peers' memory on
    one node; uneven rows go through ``MPI_Ireduce_scatter``. Either way each rank holds its
    block of MPI's all-reduce: the same bytes at two ranks, the same exact integers at more."""
    from mpi4py import MPI

    from mpisync.horovod.kernels import scatter_rows
    from mpisync.transports.policy import CROSS_REDUCE_MIN_BYTES as MIN_BYTES

    comm = started
    width = 1000
    first = -(-MIN_BYTES // (4 * width * comm.size)) * comm.size + (rows == "uneven")
    ran = _spied(monkeypatch, "reduce_steps")
    x = torch.from_numpy(_values(comm.rank, first * width, comm.size > 2)).reshape(first, width)
    whole = x.numpy().copy()
    comm.Allreduce(MPI.IN_PLACE, whole)
    counts = scatter_rows(first, comm.size)
    start = sum(counts[: comm.rank])
    got = hvd.reducescatter(x, op=hvd.Sum)
    assert got.shape == (counts[comm.rank], width)
    assert got.numpy().tobytes() == whole[start : start + counts[comm.rank]].tobytes()
    assert torch.equal(
        x, torch.from_numpy(_values(comm.rank, first * width, comm.size > 2)).reshape(first, width)
    )
    assert len(ran) == (comm.size > 1 and rows == "equal")
    assert ran == [_cross_open(comm)] * len(ran)


def _cross_open(comm) -> bool:
    """Whether the cross-memory path is open between ``comm``'s ranks (the same on every rank):
    :func:`hvd.init` duplicates ``comm``; the probe's answer is a fact of the node, not of the
    communicator."""
    from mpisync.transports.crossreduce import drive, opened

    dup = comm.Dup()
    try:
        cross, _ = drive(opened(dup), lambda request: request.Wait())
        return cross is not None
    finally:
        dup.Free()


@pytest.mark.parametrize("op", ["Sum", "Average"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32], ids=str)
@pytest.mark.parametrize("kind", ["allreduce", "reducescatter"])
def test_the_results_are_new_tensors_and_the_inputs_unchanged(started, kind, dtype, op):
    """No kernel writes into the caller's tensor or hands it back, whichever factor it scales
    by (an average's postscale is applied in place, to the kernel's own result)."""
    comm = started
    x = (torch.arange(4 * comm.size) % 7).to(dtype).reshape(2 * comm.size, 2)
    before = x.clone()
    got = getattr(hvd, kind)(x, op=getattr(hvd, op))
    assert torch.equal(x, before)
    assert got.data_ptr() != x.data_ptr()
    factor = 1 if op == "Sum" else 1 / comm.size
    whole = (before.double() * comm.size * factor).to(dtype)
    rows = 2 if kind == "reducescatter" else 2 * comm.size
    start = 2 * comm.rank if kind == "reducescatter" else 0
    assert torch.equal(got, whole[start : start + rows])


def _group_of(r: int) -> list:
    """Rank ``r``'s tensors of several dtypes (its values depend on ``r``)."""
    return [
        torch.arange(5, dtype=torch.float32) + r,
        torch.arange(4, dtype=torch.int32).reshape(2, 2) * (r + 1),
        torch.tensor(2.5 + r, dtype=torch.float64),  # 0-d
        torch.full((3,), 0.5 * (r + 1), dtype=torch.float16),
        torch.ones(2, 3) * r,
        torch.full((2,), 1.5, dtype=torch.bfloat16),
    ]


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_a_group_is_reduced_in_one_buffer_per_dtype(started, monkeypatch, op):
    """A grouped allreduce of several dtypes posts one reduction per dtype it is reduced in
    (halves with float32), and each result holds its own tensor's reduction, scaled as Horovod
    scales it, in its own dtype and shape, with the inputs unchanged."""
    from mpisync.horovod import kernels

    comm = started
    reduced: list = []
    real = kernels._reduce_in_place

    def recording(comm, call, array, mpi_op):
        reduced.append(str(array.dtype))
        real(comm, call, array, mpi_op)

    monkeypatch.setattr(kernels, "_reduce_in_place", recording)
    group = _group_of(comm.rank)
    got = hvd.grouped_allreduce(group, op=getattr(hvd, op), prescale_factor=2.0)
    assert reduced == ["float32", "int32", "float64"]
    everyone = [_group_of(r) for r in range(comm.size)]
    for i, (result, tensor) in enumerate(zip(got, group)):
        assert torch.equal(tensor, everyone[comm.rank][i])
        assert result.dtype == tensor.dtype and result.shape == tensor.shape
        assert result.data_ptr() != tensor.data_ptr()
        wide = kernels._wide(tensor.dtype)
        total = sum(kernels.scaled(mine[i], 2.0).to(wide) for mine in everyone)
        expected = total.to(tensor.dtype)
        if op == "Average":
            expected = kernels.scaled(expected, 1.0 / comm.size)
        assert torch.equal(result, expected), (i, result, expected)


def test_a_groups_results_take_in_place_ops_and_carry_gradients(started):
    """The results of a fused group share one buffer but are no views of it: autograd allows
    in-place ops on them, and the gradient flows back as Horovod's (the sum's: every rank's)."""
    comm = started
    x = torch.ones(3, requires_grad=True)
    a, b = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum)
    a.add_(1)
    single = hvd.allreduce(x, op=hvd.Sum)
    single.mul_(2)
    (a * b).sum().backward()
    n = comm.size
    # through a: the sum over ranks of b (2n on each); through b = allreduce(2x): twice the sum
    # over ranks of a (n + 1 on each): 2n^2 + 2n(n + 1)
    assert torch.equal(x.grad, torch.full((3,), float(4 * n * n + 2 * n)))
    assert torch.equal(single, torch.full((3,), 2.0 * n))


@pytest.mark.parametrize(
    "kind",
    ["allreduce", "grouped_allreduce", "allgather", "broadcast", "alltoall", "reducescatter"],
)
def test_results_take_in_place_ops_under_autograd(started, kind):
    """As Horovod's, each collective's result is a tensor of its own: an in-place op on it is
    allowed even when its input requires a gradient (autograd refuses that on a view)."""
    comm = started
    x = torch.ones(2 * comm.size, 3, requires_grad=True)
    calls = {
        "allreduce": lambda: hvd.allreduce(x, op=hvd.Sum),
        "grouped_allreduce": lambda: hvd.grouped_allreduce([x, x], op=hvd.Sum)[1],
        "allgather": lambda: hvd.allgather(x),
        "broadcast": lambda: hvd.broadcast(x, root_rank=0),
        "alltoall": lambda: hvd.alltoall(x),
        "reducescatter": lambda: hvd.reducescatter(x, op=hvd.Sum),
    }
    result = calls[kind]()
    expected = result.detach().clone() + 1
    result.add_(1)
    assert torch.equal(result.detach(), expected)
