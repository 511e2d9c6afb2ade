"""What torch or gloo forbids in a collective's arguments: on the "mpisync" backend every rank
raises the same error before anything is posted, whether one rank or every rank passed the bad
argument, and the group goes on (the next all_reduce gives the right sum). The survey behind
these cases, on gloo and mpisync side by side: ci/torch_forbidden.py, docs/allreduce.md.

The group's timeout is short: should a case regress to raising on one rank only, the others'
wait ends in the timeout (which aborts the job) instead of hanging CI. Valid at any number of
ranks."""

import pytest

from mpiutil import need_ranks

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.torch.errors import ArgumentError, MismatchError  # noqa: E402

R = dist.ReduceOp


@pytest.fixture(scope="module", autouse=True)
def process_group():
    mpisync.torch.init_process_group(timeout=10)
    yield dist.group.WORLD
    dist.destroy_process_group()


def ones(n: int, dtype=torch.float32) -> torch.Tensor:
    return torch.ones(n, dtype=dtype)


def _sparse() -> torch.Tensor:
    return ones(2).to_sparse()


def _meta() -> torch.Tensor:
    return torch.ones(2, device="meta")


# (case, call(bad, size): ``bad`` whether this rank passes the forbidden argument, a part of the
# error's message). Each call is valid where ``bad`` is False, so run with the bad argument on one
# rank only it is that rank's own problem, which every rank must raise as an ArgumentError.
CASES = {
    "all_gather_into_tensor, output too small": (
        lambda bad, s: dist.all_gather_into_tensor(ones(2 * s - bad), ones(2)),
        "expected",
    ),
    "all_gather_into_tensor, dtypes differ": (
        lambda bad, s: dist.all_gather_into_tensor(
            ones(2 * s, torch.float64 if bad else torch.float32), ones(2)
        ),
        "expected",
    ),
    "all_gather_into_tensor, a sparse input": (
        lambda bad, s: dist.all_gather_into_tensor(ones(2 * s), _sparse() if bad else ones(2)),
        "is not dense",
    ),
    "all_gather_into_tensor, a meta input": (
        lambda bad, s: dist.all_gather_into_tensor(ones(2 * s), _meta() if bad else ones(2)),
        "is on meta",
    ),
    "all_gather, a list too short": (
        lambda bad, s: dist.all_gather([ones(2) for _ in range(s - bad)], ones(2)),
        "output list 0 holds",
    ),
    "all_gather, a sparse input": (
        lambda bad, s: dist.all_gather([ones(2) for _ in range(s)], _sparse() if bad else ones(2)),
        "is not dense",
    ),
    "reduce_scatter_tensor, input too small": (
        lambda bad, s: dist.reduce_scatter_tensor(ones(2), ones(2 * s - bad)),
        "expected",
    ),
    "reduce_scatter_tensor, BAND of floats": (
        lambda bad, s: dist.reduce_scatter_tensor(
            ones(2, _float_if(bad)), ones(2 * s, _float_if(bad)), op=R.BAND
        ),
        "bitwise reductions need integer tensors",
    ),
    "reduce_scatter, a list too short": (
        lambda bad, s: dist.reduce_scatter(ones(2), [ones(2) for _ in range(s - bad)]),
        "input pieces",
    ),
    "all_to_all_single, input split sizes that do not add up": (
        lambda bad, s: dist.all_to_all_single(torch.empty(s), ones(s + bad), [1] * s, [1] * s),
        "split sizes",
    ),
    "all_to_all_single, a negative split size": (
        lambda bad, s: dist.all_to_all_single(
            torch.empty(2 * s), ones(2 * s), [2] * s, [2 - 3 * bad, 2 + 3 * bad] + [2] * (s - 2)
        ),
        "split sizes",
    ),
    "all_to_all_single, equal splits, an output of another size": (
        lambda bad, s: dist.all_to_all_single(torch.empty(2 * s + 2 * bad), ones(2 * s)),
        "equal splits",
    ),
    "all_reduce, PREMUL_SUM": (
        lambda bad, s: dist.all_reduce(
            ones(2), op=dist._make_nccl_premul_sum(2.0) if bad else R.SUM
        ),
        "PREMUL_SUM",
    ),
    "all_reduce, BAND of floats": (
        lambda bad, s: dist.all_reduce(ones(2, _float_if(bad)), op=R.BAND),
        "bitwise reductions need integer tensors",
    ),
    "all_reduce, a float8 tensor": (
        lambda bad, s: dist.all_reduce(ones(2).to(torch.float8_e4m3fn) if bad else ones(2)),
        "cannot reduce a torch.float8_e4m3fn tensor",
    ),
    "all_reduce, a meta tensor": (
        lambda bad, s: dist.all_reduce(_meta() if bad else ones(2)),
        "is on meta",
    ),
    "all_reduce, MAX of a sparse tensor": (
        lambda bad, s: dist.all_reduce(_sparse() if bad else ones(2), op=R.MAX),
        "with SUM only",
    ),
    "reduce, a sparse tensor": (
        lambda bad, s: dist.reduce(_sparse() if bad else ones(2), dst=0),
        "is not dense",
    ),
    "broadcast, a sparse tensor": (
        lambda bad, s: dist.broadcast(_sparse() if bad else ones(2), src=0),
        "is not dense",
    ),
    "broadcast, a root out of range": (
        lambda bad, s: dist.group.WORLD.broadcast([ones(2)], _root(s if bad else 0)).wait(),
        "is not a rank of this group",
    ),
    "reduce_scatter, no tensors (the group called directly)": (
        lambda bad, s: dist.group.WORLD.reduce_scatter(
            [] if bad else [ones(2)], [] if bad else [[ones(2) for _ in range(s)]]
        ).wait(),
        "no tensors given",
    ),
}


def _float_if(bad: bool):
    return torch.float32 if bad else torch.int32


def _root(rank: int):
    opts = dist.BroadcastOptions()
    opts.rootRank = rank
    return opts


def _raised_everywhere(comm, exc_type, fn, *parts) -> str:
    """``fn()`` raises ``exc_type`` here; every rank raised an error of the same type with the
    same message."""
    with pytest.raises(exc_type) as info:
        fn()
    seen = comm.allgather((type(info.value).__name__, str(info.value)))
    assert len(set(seen)) == 1, f"the ranks raised different errors: {seen}"
    message = str(info.value)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


def _group_goes_on(comm) -> None:
    tensor = torch.full((3,), float(comm.rank + 1))
    dist.all_reduce(tensor)
    assert tensor.tolist() == [float(sum(range(1, comm.size + 1)))] * 3


@pytest.mark.parametrize("case", list(CASES))
def test_forbidden_on_every_rank_raises_everywhere_and_the_group_goes_on(comm, case):
    call, part = CASES[case]
    message = _raised_everywhere(comm, ArgumentError, lambda: call(True, comm.size), part)
    assert "nothing was posted" in message
    _group_goes_on(comm)


@pytest.mark.parametrize("case", list(CASES))
def test_forbidden_on_one_rank_raises_everywhere_and_the_group_goes_on(comm, case):
    need_ranks(comm, 2)
    call, part = CASES[case]
    last = comm.size - 1
    message = _raised_everywhere(
        comm, ArgumentError, lambda: call(comm.rank == last, comm.size), part, f"rank {last} ("
    )
    assert "nothing was posted" in message
    _group_goes_on(comm)


def test_split_sizes_that_disagree_with_the_peers_are_a_mismatch_everywhere(comm):
    """Each rank's splits add up, but every rank sends one row to each where each expects two."""
    size = comm.size
    send = ones(size)
    _raised_everywhere(
        comm,
        MismatchError,
        lambda: dist.all_to_all_single(torch.empty(2 * size), send, [2] * size, [1] * size),
        "split sizes do not match",
    )
    outputs = [torch.empty(2) for _ in range(size)]
    _raised_everywhere(
        comm, MismatchError, lambda: dist.all_to_all(outputs, [ones(1)] * size), "do not match"
    )
    _group_goes_on(comm)


def test_a_tag_out_of_range_is_refused_at_both_ends_before_anything_is_posted(comm):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    received = torch.zeros(2)
    with pytest.raises(ArgumentError, match="tag -1 is not in"):
        dist.isend(ones(2), dst=right, tag=-1)
    with pytest.raises(ArgumentError, match="tag -1 is not in"):
        dist.irecv(received, src=left, tag=-1)
    with pytest.raises(ArgumentError, match="is not dense"):
        dist.isend(_sparse(), dst=right, tag=1)
    # nothing was posted: the next messages pair as they should
    works = [dist.irecv(received, src=left, tag=3), dist.isend(ones(2) * comm.rank, right, tag=3)]
    for work in works:
        work.wait()
    assert received.tolist() == [float(left)] * 2
    _group_goes_on(comm)


def test_what_gloo_refuses_or_gets_wrong_and_mpisync_computes(comm):
    """Non-contiguous outputs (gloo: broken pair, or a broadcast that leaves the receivers'
    strided elements wrong), a message to oneself (gloo: "Pair is not connected"), uint16 sums."""
    size, rank = comm.size, comm.rank
    out = torch.zeros(4 * size)[::2]
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    assert out.tolist() == [float(r) for r in range(size) for _ in range(2)]
    strided = torch.full((6,), float(rank + 1))[::2]
    dist.broadcast(strided, src=0)
    assert strided.tolist() == [1.0] * 3
    received = torch.empty(2)
    works = [dist.isend(torch.full((2,), float(rank)), dst=rank), dist.irecv(received, src=rank)]
    for work in works:
        work.wait()
    assert received.tolist() == [float(rank)] * 2
    counts = torch.full((3,), rank + 1, dtype=torch.uint16)
    dist.all_reduce(counts)
    assert counts.tolist() == [sum(range(1, size + 1))] * 3
    _group_goes_on(comm)
