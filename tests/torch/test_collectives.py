"""The "mpisync" backend's collectives beyond all_reduce, against numpy; arguments that differ
between ranks; group names, subgroups and timeouts of waits. Valid at any number of ranks."""

import time

import numpy as np
import pytest

from mpiutil import need_ranks, raises_everywhere

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync  # noqa: E402
import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.torch.errors import ArgumentError, MismatchError  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def process_group():
    mpisync.torch.init_process_group(timeout=120)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _rows(rank: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float64) + 100 * rank


def test_reduce_gather_scatter(comm):
    root = comm.size - 1
    tensor = _rows(comm.rank, 3)
    dist.reduce(tensor, dst=root, op=dist.ReduceOp.SUM)
    total = sum(_rows(r, 3) for r in range(comm.size))
    # torch leaves the other ranks' tensors unspecified (gloo: partial sums); mpisync's hold the
    # result too (an in-place all-reduce: reduce costs what all_reduce does)
    assert torch.equal(tensor, total)
    gathered = [torch.empty(3, dtype=torch.float64) for _ in range(comm.size)]
    dist.gather(_rows(comm.rank, 3), gathered if comm.rank == root else None, dst=root)
    if comm.rank == root:
        assert all(torch.equal(g, _rows(r, 3)) for r, g in enumerate(gathered))
    mine = torch.empty(3, dtype=torch.float64)
    pieces = [_rows(r, 3) * 2 for r in range(comm.size)] if comm.rank == root else None
    dist.scatter(mine, pieces, src=root)
    assert torch.equal(mine, _rows(comm.rank, 3) * 2)


def test_all_to_all_equal_and_split_sizes(comm):
    size, rank = comm.size, comm.rank
    out = torch.empty(2 * size)
    dist.all_to_all_single(out, torch.arange(2 * size, dtype=torch.float32) + 100 * rank)
    expected = [100 * j + 2 * rank + k for j in range(size) for k in range(2)]
    assert out.tolist() == [float(v) for v in expected]
    # rank r sends r + 1 rows of 3 to every rank, so it receives j + 1 rows from rank j
    sent = torch.full(((rank + 1) * size, 3), float(rank))
    received = torch.empty((sum(j + 1 for j in range(size)), 3))
    dist.all_to_all_single(received, sent, [j + 1 for j in range(size)], [rank + 1] * size)
    assert received[:, 0].tolist() == [float(j) for j in range(size) for _ in range(j + 1)]
    outputs = [torch.empty(j + 1, dtype=torch.int16) for j in range(size)]
    dist.all_to_all(outputs, [torch.full((rank + 1,), rank, dtype=torch.int16)] * size)
    assert [o.tolist() for o in outputs] == [[j] * (j + 1) for j in range(size)]


def test_reduce_scatter_with_unequal_pieces(comm):
    size, rank = comm.size, comm.rank
    out = torch.empty(rank + 1)
    dist.reduce_scatter(out, [torch.full((j + 1,), float(rank + 1)) for j in range(size)])
    assert out.tolist() == [float(sum(range(1, size + 1)))] * (rank + 1)


def test_all_gather_coalesced_and_all_reduce_coalesced(comm):
    inputs = [torch.full((2,), float(comm.rank)), torch.full((3,), float(-comm.rank))]
    outputs = [[torch.empty(2), torch.empty(3)] for _ in range(comm.size)]
    dist.all_gather_coalesced(outputs, inputs)
    assert [[o.tolist() for o in row] for row in outputs] == [
        [[float(r)] * 2, [float(-r)] * 3] for r in range(comm.size)
    ]
    tensors = [torch.ones(4), torch.full((2,), 2.0)]
    dist.all_reduce_coalesced(tensors)
    assert tensors[0].tolist() == [float(comm.size)] * 4
    assert tensors[1].tolist() == [2.0 * comm.size] * 2


def test_sparse_all_reduce_and_receive_from_any_source(comm):
    sparse = torch.sparse_coo_tensor([[comm.rank % 4]], [1.0], (4,))
    dist.all_reduce(sparse)
    expected = np.bincount([r % 4 for r in range(comm.size)], minlength=4).astype(float)
    assert sparse.to_dense().tolist() == expected.tolist()
    if comm.size < 2:
        return
    if comm.rank != 0:
        dist.send(torch.full((2,), float(comm.rank)), dst=0, tag=5)
    else:
        got = set()
        for _ in range(comm.size - 1):
            tensor = torch.empty(2)
            source = dist.recv(tensor, tag=5)
            assert tensor.tolist() == [float(source)] * 2
            got.add(source)
        assert got == set(range(1, comm.size))


def _raw(tensor: torch.Tensor) -> bytes:
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
    return tensor.view(width).numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", ["MIN", "MAX"])
def test_nan_wins_min_and_max_with_the_same_bytes_everywhere(comm, op, dtype):
    nan = float("nan")
    mine = [nan, 2.0] if comm.rank == 0 else [1.0, nan]
    tensor = torch.tensor(mine, dtype=dtype)
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op))
    if comm.size > 1:
        assert torch.isnan(tensor).all(), tensor
    assert len(set(comm.allgather(_raw(tensor)))) == 1
    reduced = torch.tensor(mine, dtype=dtype)
    dist.reduce(reduced, dst=0, op=getattr(dist.ReduceOp, op))
    assert _raw(reduced) == _raw(tensor)  # the root's result (the others hold it too)


def test_ranks_that_disagree_all_raise_the_same_error_and_nothing_is_written(comm):
    need_ranks(comm, 2)
    dtype = torch.float32 if comm.rank == 0 else torch.int32
    tensor = torch.arange(4).to(dtype)
    raises_everywhere(comm, MismatchError, lambda: dist.all_reduce(tensor), "rank 0", "int32")
    assert tensor.tolist() == [0, 1, 2, 3]
    size = 4 if comm.rank == 0 else 8
    raises_everywhere(comm, MismatchError, lambda: dist.all_reduce(torch.ones(size)), "[8]")
    op = dist.ReduceOp.SUM if comm.rank == 0 else dist.ReduceOp.MAX
    raises_everywhere(comm, MismatchError, lambda: dist.all_reduce(torch.ones(2), op=op), "max")
    root = 0 if comm.rank == 0 else 1
    raises_everywhere(comm, MismatchError, lambda: dist.broadcast(torch.ones(2), src=root))
    # a different operation on one rank: caught the same way, before anything moves
    if comm.rank == 0:
        work = lambda: dist.all_reduce(torch.ones(2))  # noqa: E731
    else:
        work = lambda: dist.broadcast(torch.ones(2), src=0)  # noqa: E731
    raises_everywhere(comm, MismatchError, work, "all_reduce", "broadcast")
    value = torch.full((3,), float(comm.rank + 1))
    dist.all_reduce(value)  # the group goes on
    assert value.tolist() == [float(sum(range(1, comm.size + 1)))] * 3


def test_a_local_problem_is_raised_on_every_rank(comm):
    need_ranks(comm, 2)
    # unequal pieces that do not fit this rank's output: refused everywhere, never a hang
    pieces = [torch.ones(j + 1) for j in range(comm.size)]
    raises_everywhere(
        comm, ArgumentError, lambda: dist.reduce_scatter(torch.zeros(1), pieces), "refused"
    )
    # outputs checked before any is written
    outputs = [torch.zeros(4), torch.zeros(8)] + [torch.zeros(4)] * (comm.size - 2)
    raises_everywhere(
        comm, ArgumentError, lambda: dist.all_gather(outputs, torch.ones(4)), "output list 0"
    )
    assert all(float(o.abs().sum()) == 0 for o in outputs)
    group = dist.group.WORLD
    raises_everywhere(
        comm,
        ArgumentError,
        lambda: group.allgather([[torch.zeros(4)]], [torch.ones(4)]).wait(),
        "expected",
    )
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(2.0)
    raises_everywhere(
        comm, ArgumentError, lambda: group.allreduce([torch.ones(2)], opts).wait(), "mpisync"
    )


def test_twenty_receives_then_twenty_sends_complete(comm):
    # More point-to-point operations than max_concurrent, waited for only after all were
    # posted: valid, so it completes (the cap holds back collectives only).
    need_ranks(comm, 2)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    received = [torch.empty(100) for _ in range(20)]
    works = [dist.irecv(t, src=left, tag=k) for k, t in enumerate(received)]
    works += [dist.isend(torch.full((100,), float(k)), dst=right, tag=k) for k in range(20)]
    for work in works:
        work.wait()
    assert [t[0].item() for t in received] == [float(k) for k in range(20)]


def test_a_wait_with_a_timeout_times_out_then_the_operation_completes(comm):
    need_ranks(comm, 2)
    import datetime

    if comm.rank == 0:
        work = dist.all_reduce(torch.ones(3), async_op=True)
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out"):
            work.wait(timeout=datetime.timedelta(seconds=0.5))
        assert 0.45 < time.monotonic() - start < 1.5
        comm.Barrier()
        assert work.wait()
    else:
        comm.Barrier()  # after rank 0's wait timed out
        dist.all_reduce(torch.ones(3))
    dist.barrier()


def test_group_names_and_destroying_any_group(comm):
    assert dist.group.WORLD.group_name
    assert dist.get_backend() == "mpisync"
    for _ in range(2):
        members = list(range(min(2, comm.size)))
        group = dist.new_group(members)
        if comm.rank in members:
            assert group.group_name and dist.get_backend(group) == "mpisync"
            tensor = torch.ones(2)
            dist.all_reduce(tensor, group=group)
            assert tensor.tolist() == [float(len(members))] * 2
            dist.destroy_process_group(group)
    everyone = dist.new_group()
    dist.barrier(group=everyone)
    dist.destroy_process_group(everyone)


def test_a_group_without_the_check_raises_a_local_problem_at_once(comm, monkeypatch):
    monkeypatch.setenv("MPISYNC_TORCH_CHECK", "0")
    group = dist.new_group(backend="mpisync")
    with pytest.raises(ArgumentError, match="output list 0 holds"):
        group.allgather([[torch.zeros(2)] if comm.size > 1 else []], [torch.ones(2)])
    dist.destroy_process_group(group)


def test_the_coalescing_manager_and_batched_point_to_point(comm):
    tensors = [torch.full((3,), float(comm.rank + 1)), torch.ones(2)]
    with dist._coalescing_manager(device=torch.device("cpu"), async_ops=True) as manager:
        for tensor in tensors:
            dist.all_reduce(tensor)
    manager.wait()
    assert tensors[0].tolist() == [float(sum(range(1, comm.size + 1)))] * 3
    assert tensors[1].tolist() == [float(comm.size)] * 2
    if comm.size < 2:
        return
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    received = torch.zeros(2)
    ops = [
        dist.P2POp(dist.isend, torch.full((2,), float(comm.rank)), right),
        dist.P2POp(dist.irecv, received, left),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert received.tolist() == [float(left)] * 2


@pytest.mark.parametrize("switch", ["MPISYNC_TORCH_CHECK", "MPISYNC_TORCH_SYNC_PARAMS"])
def test_group_creation_agrees_on_the_switches(comm, monkeypatch, switch):
    """``MPISYNC_TORCH_CHECK`` on some ranks only would pair one rank's check with another's
    data, ``MPISYNC_TORCH_SYNC_PARAMS`` one rank's ``sync_params`` with another's broadcasts:
    creating the group is the same error on every rank, naming the setting and ranks."""
    need_ranks(comm, 2)
    from mpisync.torch.process_group import ProcessGroupMPISync

    bad = comm.size - 1
    monkeypatch.setenv(switch, "0" if comm.rank == bad else "1")
    raises_everywhere(
        comm,
        MismatchError,
        lambda: ProcessGroupMPISync(comm, timeout=60),
        "ranks disagree on settings that change what travels or how it is checked",
        f"{switch}: ",
        f"rank {bad}=False",
    )
    monkeypatch.delenv(switch)
    group = ProcessGroupMPISync(comm, timeout=60)  # agreed again: the group works
    tensor = torch.ones(3)
    group.allreduce([tensor]).wait()
    assert tensor.tolist() == [float(comm.size)] * 3
    group.shutdown()


def _blocks(size: int, n: int) -> torch.Tensor:
    """Every rank's ``_rows`` end to end (what a gather of them holds)."""
    return torch.cat([_rows(r, n) for r in range(size)])


def test_in_place_all_gather_into_tensor_fsdp_form(comm):
    """FSDP2's all-gather: the input is this rank's block of the output (MPI_IN_PLACE)."""
    output = torch.zeros(3 * comm.size, dtype=torch.float64)
    mine = output.chunk(comm.size)[comm.rank]
    mine.copy_(_rows(comm.rank, 3))
    dist.all_gather_into_tensor(output, mine)
    assert torch.equal(output, _blocks(comm.size, 3))
    # an input overlapping the output elsewhere than its own block: read from a copy
    output = torch.zeros(3 * comm.size + 1, dtype=torch.float64)
    source = output[1:4]
    source.copy_(_rows(comm.rank, 3))
    dist.all_gather_into_tensor(output[1:], source)
    assert torch.equal(output[1:], _blocks(comm.size, 3))


def test_in_place_all_gather_list_and_reduce_scatter_tensor(comm):
    size, rank = comm.size, comm.rank
    flat = torch.zeros(3 * size, dtype=torch.float64)
    outputs = list(flat.chunk(size))
    outputs[rank].copy_(_rows(rank, 3))
    dist.all_gather(outputs, outputs[rank])
    assert torch.equal(flat, _blocks(size, 3))
    # FSDP's reduce-scatter: the output is this rank's block of the input
    data = torch.arange(4 * size, dtype=torch.float64) + rank
    expected = sum(torch.arange(4 * size, dtype=torch.float64) + r for r in range(size))
    block = data.chunk(size)[rank]
    dist.reduce_scatter_tensor(block, data)
    assert torch.equal(block, expected.chunk(size)[rank])


def test_all_to_all_single_with_one_tensor_in_and_out(comm):
    size, rank = comm.size, comm.rank
    tensor = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
    dist.all_to_all_single(tensor, tensor)
    expected = torch.cat(
        [
            (torch.arange(2 * size, dtype=torch.float32) + 100 * r)[2 * rank : 2 * rank + 2]
            for r in range(size)
        ]
    )
    assert torch.equal(tensor, expected)


def test_coalesced_all_reduce_with_a_tensor_twice_or_overlapping_views(comm):
    """What gloo computes: each tensor reduced from the values at the call, written back in
    order (one tensor twice: the sum once, not twice; the failure: 5 and 4 where 3 was due)."""
    total = sum(range(1, comm.size + 1))
    tensor = torch.full((5,), float(comm.rank + 1))
    dist.all_reduce_coalesced([tensor, tensor])
    assert tensor.tolist() == [float(total)] * 5
    base = torch.full((6,), float(comm.rank + 1))
    dist.all_reduce_coalesced([base[0:4], base[2:6]])
    assert base.tolist() == [float(total)] * 6
    ints = torch.full((4,), comm.rank + 1, dtype=torch.int64)
    dist.all_reduce_coalesced([ints, ints[1:3]], op=dist.ReduceOp.MAX)
    assert ints.tolist() == [comm.size] * 4


def test_in_place_on_some_ranks_only(comm):
    """MPI wants MPI_IN_PLACE on every rank or none: where only rank 0 passes aliased buffers,
    every rank runs the plain form (rank 0 from a copy), and the results are the same."""
    need_ranks(comm, 2)
    size, rank, aliased = comm.size, comm.rank, comm.rank == 0
    output = torch.zeros(3 * size, dtype=torch.float64)
    source = output.chunk(size)[rank] if aliased else torch.empty(3, dtype=torch.float64)
    source.copy_(_rows(rank, 3))
    dist.all_gather_into_tensor(output, source)
    assert torch.equal(output, _blocks(size, 3))
    data = torch.arange(4 * size, dtype=torch.float64) + rank
    expected = sum(torch.arange(4 * size, dtype=torch.float64) + r for r in range(size))
    block = data.chunk(size)[rank] if aliased else torch.empty(4, dtype=torch.float64)
    dist.reduce_scatter_tensor(block, data)
    assert torch.equal(block, expected.chunk(size)[rank])
    tensor = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
    out = tensor if aliased else torch.empty_like(tensor)
    dist.all_to_all_single(out, tensor)
    sent = [torch.arange(2 * size, dtype=torch.float32) + 100 * r for r in range(size)]
    assert torch.equal(out, torch.cat([s[2 * rank : 2 * rank + 2] for s in sent]))
