"""The backend's paths of its own on one node: ``all_reduce``, ``reduce``, and the list forms of
``all_gather`` and ``reduce_scatter``, of large tensors by
cross-memory, and the plain ``reduce_scatter_tensor`` of two ranks by one exchange. Their bytes
are gloo's and MPI's (two ranks: two operands combine alike in either order), every rank's the
same at more ranks, for every reduction and the dtypes that take these paths."""

import numpy as np
import pytest
from mpi4py import MPI

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torchutil import rank_values, tensor_bytes  # noqa: E402

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.transports import crossbcast  # noqa: E402
from mpisync.transports.policy import CROSS_REDUCE_MIN_BYTES as MIN_BYTES  # noqa: E402

from mpiutil import taken  # noqa: E402

MID = (1 << 20) // 8 + 3  # elements: a little over 1 MiB of float32, over 2 MiB of int64

_MPI_OPS = {"SUM": MPI.SUM, "PRODUCT": MPI.PROD, "MIN": MPI.MIN, "MAX": MPI.MAX}


@pytest.fixture(scope="module", autouse=True)
def groups():
    """The mpisync default group and a gloo group of the same ranks (the reference)."""
    mpisync.torch.init_process_group(backend="cpu:mpisync,cuda:gloo", timeout=120)
    yield dist.group.WORLD, dist.new_group(backend="gloo")
    dist.destroy_process_group()


@pytest.mark.parametrize("op", ["SUM", "MAX", "MIN", "AVG"])
@pytest.mark.parametrize("kind", ["all_reduce", "reduce to 0", "reduce to the last rank"])
def test_a_large_all_reduce_has_gloos_bytes(comm, groups, op, kind, need_gloo):
    """Every rank's all_reduce, and the root's reduce, hold gloo's bytes (the other ranks of a
    reduce hold values torch leaves unspecified)."""
    if op == "AVG":
        need_gloo("AVG")
    size, rank = comm.size, comm.rank
    n = MIN_BYTES // 4 + 5  # float32: just over the cross-memory threshold
    data = rank_values(rank, n, torch.float32, exact=size > 2)
    dst = 0 if kind == "reduce to 0" else size - 1
    results = []
    for group in groups:
        t = data.clone()
        if kind == "all_reduce":
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
        else:
            dist.reduce(t, dst=dst, op=getattr(dist.ReduceOp, op), group=group)
        results.append(t)
    if kind == "all_reduce" or rank == dst:
        assert tensor_bytes(results[0]) == tensor_bytes(results[1])
    if kind == "all_reduce":
        everyone = np.empty((size, n * 4), np.uint8)
        comm.Allgather(results[0].view(torch.uint8).numpy(), everyone)
        assert (everyone == everyone[0]).all()


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.int8, torch.int64, torch.uint8], ids=str
)
@pytest.mark.parametrize("op", list(_MPI_OPS))
@pytest.mark.parametrize("count", [1, 7, 65537])
def test_the_plain_reduce_scatter_tensor_has_mpis_bytes(comm, dtype, op, count):
    size, rank = comm.size, comm.rank
    data = rank_values(rank, count * size, dtype, exact=op == "PRODUCT")
    out = torch.empty(count, dtype=dtype)
    dist.reduce_scatter_tensor(out, data.clone(), op=getattr(dist.ReduceOp, op))
    expected = np.empty(count, dtype=out.numpy().dtype)
    comm.Reduce_scatter_block(data.numpy(), expected, _MPI_OPS[op])
    if size <= 2 or not dtype.is_floating_point:
        assert tensor_bytes(out) == expected.tobytes(), (count, dtype, op)


def test_the_plain_reduce_scatter_tensor_has_gloos_bytes(comm, groups):
    size, rank = comm.size, comm.rank
    data = rank_values(rank, 65537 * size, torch.float32, exact=size > 2)
    outs = []
    for group in groups:
        out = torch.empty(65537)
        dist.reduce_scatter_tensor(out, data.clone(), group=group)
        outs.append(out)
    assert tensor_bytes(outs[0]) == tensor_bytes(outs[1])


def test_the_plain_form_beside_the_in_place_form_and_a_staged_dtype(comm):
    """Rank 0 in place, the others plain, then a float16 reduce-scatter (no exchange): every
    rank's bytes are the sums, the input's other blocks untouched where in place."""
    size, rank = comm.size, comm.rank
    count = 1000
    data = rank_values(rank, count * size, torch.float64, exact=True)
    whole = data.clone()
    out = whole.chunk(size)[rank] if rank == 0 else torch.empty(count, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, whole)
    expected = sum(rank_values(r, count * size, torch.float64, True) for r in range(size))
    assert torch.equal(out, expected.chunk(size)[rank])
    assert all(
        torch.equal(whole.chunk(size)[r], data.chunk(size)[r]) for r in range(size) if r != rank
    )
    half = torch.empty(count, dtype=torch.float16)
    dist.reduce_scatter_tensor(half, data.to(torch.float16))
    assert torch.equal(half, expected.chunk(size)[rank].to(torch.float16))


@pytest.mark.parametrize("op", ["SUM", "MAX", "MIN", "AVG", "PRODUCT"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64], ids=str)
@pytest.mark.parametrize("kind", ["all_reduce", "reduce to the last rank"])
def test_a_mid_size_all_reduce_has_gloos_bytes(comm, groups, op, dtype, kind, need_gloo):
    """From its first call on a group, a tensor of 1-2 MiB (as reduced: float16 in float32)
    holds gloo's bytes (small integers at more than two ranks, where gloo sums in another
    order), every rank the same."""
    if dtype == torch.int64 and op == "AVG":
        pytest.skip("gloo has no AVG of integers")
    if op == "AVG":
        need_gloo("AVG")
    size, rank = comm.size, comm.rank
    n = MID
    sub = dist.new_group(backend="mpisync")  # a new group: its first calls
    for round_ in range(3):
        data = rank_values(rank + 10 * round_, n, dtype, exact=size > 2 or op == "PRODUCT")
        results = []
        for group in (sub, groups[1]):
            t = data.clone()
            if kind == "all_reduce":
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=group)
            else:
                dist.reduce(t, dst=size - 1, op=getattr(dist.ReduceOp, op), group=group)
            results.append(t)
        if kind == "all_reduce" or rank == size - 1:
            assert tensor_bytes(results[0]) == tensor_bytes(results[1]), round_
    dist.destroy_process_group(sub)


def test_mid_size_all_reduces_in_flight_together_keep_their_own_bytes(comm, groups):
    """Operations issued one after another without waiting keep their own bytes."""
    rank = comm.rank
    n = MID
    sub = dist.new_group(backend="mpisync")
    inputs = [rank_values(rank + 100 * k, n, torch.float32, exact=True) for k in range(12)]
    tensors = [t.clone() for t in inputs]
    works = [dist.all_reduce(t, group=sub, async_op=True) for t in tensors]
    for work in works:
        work.wait()
    for k, (t, data) in enumerate(zip(tensors, inputs)):
        expected = data.clone()
        dist.all_reduce(expected, group=groups[1])
        assert tensor_bytes(t) == tensor_bytes(expected), k
    dist.destroy_process_group(sub)


@pytest.mark.parametrize("op", ["MAX", "MIN"])
def test_a_large_all_reduce_lets_nan_win(comm, op):
    """As torch's ``maximum``/``minimum`` (gloo's keeps a number there)."""
    size, rank = comm.size, comm.rank
    n = MIN_BYTES // 4 + 5
    every = [rank_values(r, n, torch.float32) for r in range(size)]
    for r, d in enumerate(every):
        d[r::7] = float("nan")
    t = every[rank].clone()
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    combine = torch.maximum if op == "MAX" else torch.minimum
    expected = every[0]
    for d in every[1:]:
        expected = combine(expected, d)
    assert torch.equal(t.isnan(), expected.isnan())
    assert torch.equal(t.nan_to_num(), expected.nan_to_num())


@pytest.mark.parametrize("form", ["plain", "own block", "another rank's block", "mixed"])
@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_a_large_reduce_scatter_tensor_has_mpis_bytes(comm, form, op):
    """An input of at least the cross-memory threshold, in each form a rank may pass (``mixed``:
    rank 0 in place, the others plain): MPI's bytes at two ranks, the exact result at more, and
    the input's other blocks untouched where the output lies in it."""
    size, rank = comm.size, comm.rank
    count = MIN_BYTES // 4 // size + 3
    data = rank_values(rank, count * size, torch.float32, exact=size > 2)
    whole = data.clone()
    in_place = form in ("own block", "another rank's block") or (form == "mixed" and rank == 0)
    block = rank if form != "another rank's block" else (rank + 1) % size
    out = whole.chunk(size)[block] if in_place else torch.empty(count)
    dist.reduce_scatter_tensor(out, whole, op=getattr(dist.ReduceOp, op))
    expected = np.empty(count, np.float32)
    comm.Reduce_scatter_block(data.numpy(), expected, _MPI_OPS[op])
    assert tensor_bytes(out) == expected.tobytes()
    for r in range(size):
        if not in_place or r != block:
            assert torch.equal(whole.chunk(size)[r], data.chunk(size)[r]), r


@pytest.mark.parametrize(
    "outputs", ["separate", "the input among them", "one tensor's chunks", "one twice", "strided"]
)
def test_a_large_all_gather_has_every_ranks_bytes(comm, outputs):
    """The list form, its outputs as users pass them: each rank's input in its output, in rank
    order (``one twice``: the last rank's, as gloo's copies in order leave it); the input
    untouched."""
    size, rank = comm.size, comm.rank
    n = MIN_BYTES // 4 // size + 3  # float32: the outputs hold just over the threshold
    every = [rank_values(r, n, torch.float32) for r in range(size)]
    data = every[rank].clone()
    if outputs == "one tensor's chunks":
        outs = list(torch.empty(n * size).chunk(size))
    elif outputs == "one twice":
        shared = torch.empty(n)
        outs = [shared] * size
    elif outputs == "strided":
        outs = [torch.empty(2 * n)[::2] for _ in range(size)]
    else:
        outs = [torch.full((n,), -1.0) for _ in range(size)]
    if outputs == "the input among them":
        outs[rank] = data
    dist.all_gather(outs, data)
    expected = [every[-1]] * size if outputs == "one twice" else every
    for r in range(size):
        assert tensor_bytes(outs[r]) == tensor_bytes(expected[r]), r
    assert tensor_bytes(data) == tensor_bytes(every[rank])


@pytest.mark.parametrize(
    "pieces", ["separate", "one tensor's chunks", "one twice", "the output among them"]
)
@pytest.mark.parametrize("op", ["SUM", "MAX", "AVG"])
def test_a_large_reduce_scatter_has_mpis_bytes(comm, groups, pieces, op, need_gloo):
    """The list form with pieces of at least the cross-memory threshold in all: gloo's bytes
    (the exact result at more than two ranks), the pieces untouched where the output is not
    among them."""
    need_gloo("reduce_scatter")
    if op == "AVG":
        need_gloo("AVG")
    size, rank = comm.size, comm.rank
    n = MIN_BYTES // 4 // size + 3
    data = rank_values(rank, n * size, torch.float32, exact=size > 2)
    results = []
    for group in groups:
        if pieces == "one tensor's chunks":
            inputs = list(data.clone().chunk(size))
        elif pieces == "one twice":
            inputs = [data[:n].clone()] * size
        else:
            inputs = [c.clone() for c in data.chunk(size)]
        before = [tensor_bytes(p) for p in inputs]
        out = inputs[rank] if pieces == "the output among them" else torch.empty(n)
        dist.reduce_scatter(out, inputs, op=getattr(dist.ReduceOp, op), group=group)
        results.append(tensor_bytes(out))
        if pieces != "the output among them":
            assert [tensor_bytes(p) for p in inputs] == before
    assert results[0] == results[1]


@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("form", ["contiguous", "strided", "bool"])
def test_a_large_broadcast_has_roots_bytes_by_cross_memory(comm, monkeypatch, where, form):
    """One tensor of at least the broadcast's threshold: root's bytes on every rank, through the
    cross-memory broadcast where every rank shares one node (a strided tensor through its
    contiguous copy); a small one through MPI."""
    from mpisync.transports.cma import enabled
    from mpisync.transports.policy import CROSS_BROADCAST_MIN_BYTES as BROADCAST_MIN

    ran = taken(monkeypatch, crossbcast, "bcast_steps")
    size, rank = comm.size, comm.rank
    root = 0 if where == "first" else size - 1
    n = BROADCAST_MIN // (1 if form == "bool" else 4) + 7  # just over the threshold
    if form == "bool":
        values = [rank_values(r, n, torch.float32) > 0 for r in range(size)]
        data = values[rank].clone()
    elif form == "strided":
        values = [rank_values(r, n, torch.float32) for r in range(size)]
        data = torch.empty(2 * n)[::2]
        data.copy_(values[rank])
    else:
        values = [rank_values(r, n, torch.float32) for r in range(size)]
        data = values[rank].clone()
    dist.broadcast(data, src=root)
    assert tensor_bytes(data) == tensor_bytes(values[root])
    dist.broadcast(small := rank_values(rank, 5, torch.float32), src=root)  # below it: MPI
    assert tensor_bytes(small) == tensor_bytes(rank_values(root, 5, torch.float32))
    same_node = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
    opened = size > 1 and same_node and bool(comm.allreduce(int(enabled()), op=MPI.MIN))
    assert ran == ([opened] if size > 1 else [])
