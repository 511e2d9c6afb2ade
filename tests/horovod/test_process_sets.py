"""Process sets: operations on sub-communicators, root ranks given as global ranks."""

import pytest

from mpiutil import raises_everywhere

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi


def test_even_and_odd_sets(started):
    comm = started
    if comm.size == 1:
        pytest.skip("needs a set other than the global one (two ranks)")
    even = hvd.add_process_set(list(range(0, comm.size, 2)))
    odd = hvd.add_process_set(list(range(1, comm.size, 2)))
    mine = even if comm.rank % 2 == 0 else odd
    assert mine.included() and mine.rank() == comm.rank // 2
    got = hvd.allreduce(torch.tensor([float(comm.rank)]), op=hvd.Sum, process_set=mine)
    assert got.item() == float(sum(mine.ranks))
    root = mine.ranks[-1]
    assert hvd.broadcast(torch.tensor([comm.rank]), root, process_set=mine).item() == root
    assert hvd.broadcast_object({"r": comm.rank}, root, process_set=mine) == {"r": root}
    assert hvd.allgather(torch.tensor([comm.rank]), process_set=mine).tolist() == mine.ranks
    hvd.barrier(process_set=mine)
    other = odd if mine is even else even
    with pytest.raises(hvd.HorovodArgumentError, match="not in process set"):
        hvd.allreduce(torch.ones(1), process_set=other)
    assert hvd.remove_process_set(odd) and hvd.remove_process_set(even)
    assert not hvd.remove_process_set(even)


def test_add_process_set_with_different_ranks_raises_everywhere(started):
    comm = started
    if comm.size == 1:
        pytest.skip("needs two ranks")
    raises_everywhere(
        comm,
        hvd.HorovodArgumentError,
        lambda: hvd.add_process_set([comm.rank]),
        "ranks passed differ between ranks",
    )


def test_init_with_process_sets(comm):
    if comm.size == 1:
        pytest.skip("needs a set other than the global one (two ranks)")
    first = hvd.ProcessSet([0])
    hvd.init(comm, process_sets=[first])
    try:
        assert first.process_set_id == 1
        if comm.rank == 0:
            assert hvd.allreduce(torch.ones(1), process_set=first).item() == 1.0
    finally:
        hvd.shutdown()
    assert first.process_set_id is None


def test_distributed_optimizer_on_a_process_set(started):
    comm = started
    if comm.size == 1:
        pytest.skip("needs a set other than the global one (two ranks)")
    first = hvd.add_process_set([0])
    weight = torch.nn.Parameter(torch.zeros(2))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([weight], lr=1.0), process_set=first)
    weight.grad = torch.full((2,), comm.rank + 1.0)
    opt.step()  # rank 0 alone in the set; the others step with their own gradients
    assert weight.tolist() == [-(comm.rank + 1.0)] * 2
    hvd.remove_process_set(first)
