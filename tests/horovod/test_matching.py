"""Operations match by name across ranks; disagreements raise the same error on every rank."""

import pytest

from mpiutil import raises_everywhere

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi


def test_async_operations_match_by_name_not_order(started):
    comm = started
    names = ["a", "b", "c"] if comm.rank % 2 == 0 else ["c", "a", "b"]
    values = {"a": 1.0, "b": 10.0, "c": 100.0}
    handles = {
        n: hvd.allreduce_async(torch.full((3,), values[n] * (comm.rank + 1)), name=n, op=hvd.Sum)
        for n in names
    }
    total = sum(range(1, comm.size + 1))
    for n in reversed(names):
        assert hvd.synchronize(handles[n]).tolist() == [values[n] * total] * 3
        assert hvd.poll(handles[n])


def test_duplicate_pending_name_is_refused_here_and_modifies_nothing(started):
    comm = started
    x = torch.ones(4)
    first = hvd.allreduce_async_(x, name="dup", op=hvd.Sum)
    kept = torch.full((2,), 7.0)
    with pytest.raises(hvd.HorovodArgumentError, match="'allreduce.dup' is already in flight"):
        hvd.allreduce_async_(kept, name="dup", prescale_factor=3.0)
    assert kept.tolist() == [7.0, 7.0]
    assert hvd.synchronize(first) is x and x.tolist() == [float(comm.size)] * 4


def test_one_name_in_two_kinds_is_two_operations(started):
    comm = started
    reduced = hvd.allreduce_async(torch.ones(2), name="x", op=hvd.Sum)
    gathered = hvd.allgather_async(torch.full((1,), float(comm.rank)), name="x")
    assert hvd.synchronize(gathered).tolist() == [float(r) for r in range(comm.size)]
    assert hvd.synchronize(reduced).tolist() == [float(comm.size)] * 2


def test_process_set_none_is_the_global_set(started):
    comm = started
    handle = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, process_set=None)
    assert hvd.synchronize(handle).tolist() == [float(comm.size)] * 2


@pytest.mark.parametrize(
    "differs", [{"op": "Sum"}, {"prescale_factor": 2.0}, {"postscale_factor": 0.5}]
)
def test_ranks_that_disagree_on_the_op_or_a_factor_raise_everywhere(started, differs):
    comm = started
    if comm.size == 1:
        pytest.skip("needs two ranks")
    given = {k: getattr(hvd, v) if k == "op" else v for k, v in differs.items()}
    x = torch.ones(3)
    raises_everywhere(
        comm,
        hvd.HorovodInternalError,
        lambda: hvd.allreduce_(x, name="f", **(given if comm.rank == 0 else {})),
        "ranks disagree about operation 'allreduce.f'",
    )
    assert x.tolist() == [1.0] * 3


def test_shape_and_dtype_mismatch_raise_everywhere_and_modify_nothing(started):
    comm = started
    if comm.size == 1:
        pytest.skip("needs two ranks")
    x = torch.ones(3 + comm.rank)
    message = raises_everywhere(
        comm,
        hvd.HorovodInternalError,
        lambda: hvd.allreduce_(x, name="m", prescale_factor=2.0),
        "ranks disagree about operation 'allreduce.m'",
    )
    assert "rank 0: allreduce" in message and x.tolist() == [1.0] * (3 + comm.rank)
    t = torch.ones(2, dtype=torch.int32 if comm.rank == 0 else torch.float32)
    raises_everywhere(comm, RuntimeError, lambda: hvd.allgather(t), "int32", "float32")
    raises_everywhere(comm, RuntimeError, lambda: hvd.broadcast(torch.ones(2), comm.rank))


def test_different_operations_raise_everywhere_instead_of_waiting(started):
    comm = started
    if comm.size == 1:
        pytest.skip("needs two ranks")

    def mismatched():
        if comm.rank == 0:
            hvd.allreduce(torch.ones(2), name="only_on_0")
        else:
            hvd.barrier()

    message = raises_everywhere(
        comm, hvd.HorovodInternalError, mismatched, "wait for different operations"
    )
    assert "rank 0: allreduce 'allreduce.only_on_0'" in message
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == comm.size  # the engine goes on


def test_an_argument_refused_on_one_rank_raises_on_every_rank(started):
    comm = started
    splits = [comm.size + 5] + [0] * (comm.size - 1) if comm.rank == 0 else [1] * comm.size
    message = raises_everywhere(
        comm,
        hvd.HorovodArgumentError,
        lambda: hvd.alltoall(torch.ones(comm.size), splits=splits),
        "rank 0: splits sum to",
    )
    assert "HorovodArgumentError" not in message  # the reason itself, on every rank
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == comm.size  # the engine goes on


def test_join_feeds_zeros_to_the_others_allreduces_and_returns_the_last(started):
    comm = started
    if comm.rank == 0:
        last = hvd.join()
    else:
        got = hvd.allreduce(torch.full((2,), float(comm.rank)), name="j", op=hvd.Sum)
        assert got.tolist() == [float(sum(range(comm.size)))] * 2
        average = hvd.allreduce(torch.full((2,), 2.0 * comm.size), name="avg")
        assert average.tolist() == [2.0 * (comm.size - 1)] * 2  # joined ranks count as zeros
        last = hvd.join()
    assert last == (comm.size - 1 if comm.size > 1 else 0)
    assert hvd.allgather_object(last) == [last] * comm.size


def test_join_feeds_zeros_to_a_fused_group_of_several_dtypes(started):
    """A joined rank posts the same fused buffers as the ranks that reduce the group: one per
    dtype, one of them from ``MIN_BYTES`` (cross-memory on one node)."""
    from mpisync.transports.policy import CROSS_REDUCE_MIN_BYTES as MIN_BYTES

    comm = started
    if comm.rank == 0:
        last = hvd.join()
    else:
        group = [
            torch.full((3,), comm.rank, dtype=torch.int32),
            torch.full((MIN_BYTES // 4 + 1,), float(comm.rank)),
            torch.full((2,), float(comm.rank), dtype=torch.float64),
        ]
        got = hvd.grouped_allreduce(group, name="jg", op=hvd.Sum)
        total = sum(range(comm.size))
        for result, tensor in zip(got, group):
            assert result.dtype == tensor.dtype and torch.equal(
                result, torch.full_like(tensor, total)
            )
        last = hvd.join()
    assert last == (comm.size - 1 if comm.size > 1 else 0)


def test_a_tensor_that_cannot_travel_on_one_rank_raises_on_every_rank(started):
    comm = started
    dense = torch.eye(3)
    x = dense.to_sparse() if comm.rank == comm.size - 1 else dense
    raises_everywhere(
        comm,
        hvd.HorovodArgumentError,
        lambda: hvd.allreduce(x, name="sp"),
        f"rank {comm.size - 1}: tensor 0 is a sparse tensor",
    )
