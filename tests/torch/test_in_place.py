"""The in-place forms of reduce_scatter_tensor (the output this rank's block of the input) and
all_to_all_single (one tensor in and out): the bytes of the plain forms and of gloo, at any
number of ranks, for block sizes that are odd, one element, or large enough for MPI's
rendezvous protocol, and where only some ranks pass aliased buffers. all_to_all of tensor
lists, with the inputs as outputs, outputs that are views of one tensor or not contiguous, and
all_to_all_single with split sizes that differ by pair: gloo's bytes, on each of their two
paths."""

import numpy as np
import pytest

pytestmark = pytest.mark.mpi
torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from torchutil import rank_values, tensor_bytes  # noqa: E402

import mpisync.torch  # noqa: E402  (registers the backend)
from mpisync.transports import policy  # noqa: E402

# elements per rank's block: one, odd, and over MPI's eager limit
_COUNTS = (1, 7, 65537)
_REDUCIBLE = (torch.float32, torch.float64, torch.int8, torch.int64, torch.uint8, torch.float16)


@pytest.fixture(scope="module", autouse=True)
def groups():
    """The mpisync default group (its CPU tensors on mpisync; gloo rendezvouses through the
    store a mixed backend string brings), and a gloo group of the same ranks (the reference)."""
    mpisync.torch.init_process_group(backend="cpu:mpisync,cuda:gloo", timeout=120)
    yield dist.group.WORLD, dist.new_group(backend="gloo")
    dist.destroy_process_group()


def _reduce_scatter_pair(group, size, rank, data, op) -> tuple:
    """``(plain output, in-place output, the in-place input afterwards)`` on ``group``."""
    plain = torch.empty(data.numel() // size, dtype=data.dtype)
    dist.reduce_scatter_tensor(plain, data.clone(), op=op, group=group)
    whole = data.clone()
    mine = whole.chunk(size)[rank]
    dist.reduce_scatter_tensor(mine, whole, op=op, group=group)
    return plain, mine.clone(), whole


@pytest.mark.parametrize("dtype", _REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX", "AVG"])
def test_in_place_reduce_scatter_tensor_has_the_plain_forms_bytes(comm, dtype, op):
    size, rank = comm.size, comm.rank
    reduce_op = getattr(dist.ReduceOp, op)
    if op == "AVG" and not dtype.is_floating_point:
        pytest.skip("torch's AVG is defined for floating point tensors")
    for count in _COUNTS:
        data = rank_values(rank, count * size, dtype, exact=op == "PRODUCT")
        plain, mine, whole = _reduce_scatter_pair(None, size, rank, data, reduce_op)
        assert tensor_bytes(mine) == tensor_bytes(plain), (count, dtype, op)
        others = [b for r, b in enumerate(whole.chunk(size)) if r != rank]
        assert all(
            tensor_bytes(b) == tensor_bytes(d) for b, d in zip(others, _others(data, size, rank))
        )


def _others(data: torch.Tensor, size: int, rank: int) -> list:
    return [b for r, b in enumerate(data.chunk(size)) if r != rank]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_in_place_reduce_scatter_tensor_has_glooss_bytes(comm, groups, dtype):
    size, rank = comm.size, comm.rank
    gloo = groups[1]
    for count in _COUNTS:
        # random floats where two ranks add (one order), small integers beyond
        data = rank_values(rank, count * size, dtype, exact=size > 2)
        ours = _reduce_scatter_pair(None, size, rank, data, dist.ReduceOp.SUM)
        theirs = _reduce_scatter_pair(gloo, size, rank, data, dist.ReduceOp.SUM)
        assert [tensor_bytes(t) for t in ours[:2]] == [tensor_bytes(t) for t in theirs[:2]], count
        expected = sum(rank_values(r, count * size, dtype, size > 2) for r in range(size))
        if size <= 2 or not dtype.is_floating_point:
            assert torch.equal(ours[1], expected.chunk(size)[rank].to(dtype))


@pytest.mark.parametrize("op", ["BAND", "BOR", "BXOR"])
def test_in_place_reduce_scatter_tensor_bitwise(comm, op):
    size, rank = comm.size, comm.rank
    data = torch.from_numpy(np.random.default_rng(rank).integers(0, 1 << 62, 7 * size))
    plain, mine, _ = _reduce_scatter_pair(None, size, rank, data, getattr(dist.ReduceOp, op))
    every = [np.random.default_rng(r).integers(0, 1 << 62, 7 * size) for r in range(size)]
    combine = {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    expected = combine.reduce(every)[7 * rank : 7 * rank + 7]
    assert mine.tolist() == plain.tolist() == expected.tolist()


def test_in_place_reduce_scatter_tensor_into_another_ranks_block(comm):
    """An output that is a block of the input, but not this rank's: the plain form's result,
    the input's other blocks as they were."""
    size, rank = comm.size, comm.rank
    data = rank_values(rank, 5 * size, torch.float64, exact=True)
    whole = data.clone()
    other = (rank + 1) % size
    out = whole.chunk(size)[other]
    dist.reduce_scatter_tensor(out, whole)
    expected = sum(rank_values(r, 5 * size, torch.float64, True) for r in range(size))
    assert torch.equal(out, expected.chunk(size)[rank])
    for r in range(size):
        if r != other:
            assert torch.equal(whole.chunk(size)[r], data.chunk(size)[r])


def _all_to_all_pair(group, data: torch.Tensor, splits=None) -> tuple:
    """``(plain output, the one tensor in and out afterwards)`` on ``group``."""
    plain = torch.empty_like(data)
    dist.all_to_all_single(plain, data.clone(), splits, splits, group=group)
    one = data.clone()
    dist.all_to_all_single(one, one, splits, splits, group=group)
    return plain, one


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.float16, torch.bool], ids=str)
def test_all_to_all_single_with_one_tensor_has_the_plain_forms_and_gloos_bytes(comm, groups, dtype):
    size, rank = comm.size, comm.rank
    for count in _COUNTS:
        data = rank_values(rank, count * size, torch.float64, exact=False)
        data = (data > 0) if dtype == torch.bool else data.to(dtype)
        data = data.reshape(size, count) if count > 1 else data
        plain, one = _all_to_all_pair(None, data)
        assert tensor_bytes(one) == tensor_bytes(plain), (count, dtype)
        every = [rank_values(r, count * size, torch.float64, False) for r in range(size)]
        every = [(e > 0) if dtype == torch.bool else e.to(dtype) for e in every]
        expected = torch.cat([e.chunk(size)[rank] for e in every])
        assert tensor_bytes(one) == tensor_bytes(expected), (count, dtype)
        if dtype != torch.bool:  # gloo's own one-tensor form reads what it already wrote
            assert tensor_bytes(_all_to_all_pair(groups[1], data)[0]) == tensor_bytes(plain)


def test_all_to_all_single_with_one_tensor_and_split_sizes(comm, groups, list_path):
    """Rows split unequally, from a copy: ``rank + peer + 1`` rows each way between two ranks
    (the same splits in and out, as one tensor needs), by either path of split sizes."""
    size, rank = comm.size, comm.rank
    splits = [rank + peer + 1 for peer in range(size)]
    rows = sum(splits)
    data = rank_values(rank, rows * 3, torch.float32, exact=False).reshape(rows, 3)
    plain, one = _all_to_all_pair(None, data, splits)
    theirs = _all_to_all_pair(groups[1], data, splits)[0]
    assert tensor_bytes(one) == tensor_bytes(plain) == tensor_bytes(theirs)


def _rows_between(sender: int, receiver: int) -> int:
    """Rows ``sender`` sends ``receiver`` in the split-size tests: none for some pairs, and not
    what ``receiver`` sends back."""
    return (sender + 2 * receiver) % 3


def _split_rows(sender: int, receiver: int, rows: int) -> torch.Tensor:
    """The rows ``sender`` sends ``receiver``: values that name both and each row."""
    values = torch.arange(rows * 3, dtype=torch.float64) + 1000 * sender + 100 * receiver
    return values.reshape(rows, 3)


@pytest.mark.parametrize("form", ["separate tensors", "a non-contiguous output"])
def test_all_to_all_single_with_split_sizes_that_differ_by_pair(comm, groups, form, list_path):
    """Rank ``r`` sends rank ``j`` ``(r + 2 j) % 3`` rows (none to some peers, not what it gets
    back), by either path: each block where it belongs, and gloo's bytes."""
    size, rank = comm.size, comm.rank
    in_splits = [_rows_between(rank, j) for j in range(size)]
    out_splits = [_rows_between(j, rank) for j in range(size)]
    data = torch.cat([_split_rows(rank, j, in_splits[j]) for j in range(size)])
    outputs = []
    for group in (None, groups[1]):
        out = torch.full((sum(out_splits), 3), -1.0, dtype=torch.float64)
        if form == "a non-contiguous output" and group is None:
            out = torch.full((sum(out_splits), 6), -1.0, dtype=torch.float64)[:, ::2]
        dist.all_to_all_single(out, data, out_splits, in_splits, group=group)
        outputs.append(tensor_bytes(out))
    expected = torch.cat([_split_rows(j, rank, out_splits[j]) for j in range(size)])
    assert outputs[0] == tensor_bytes(expected)
    assert outputs[0] == outputs[1]


def _all_to_all_list(group, rank: int, size: int, count: int, form: str, grow: int = 0) -> list:
    """The outputs' bytes after ``all_to_all`` on ``group`` in ``form``: rank ``r`` sends rank
    ``j`` ``count + grow * j`` values of its own."""
    data = [rank_values(rank * size + j, count + grow * j, torch.float32) for j in range(size)]
    wanted = [count + grow * rank] * size
    if form == "the inputs as outputs":
        inputs = outputs = data
    elif form == "outputs as views of one tensor":
        inputs, outputs = data, list(torch.empty(sum(wanted)).split(wanted))
    else:
        inputs, outputs = data, [torch.empty(n) for n in wanted]
        if form == "a non-contiguous output":
            outputs[0] = torch.empty(2 * wanted[0])[::2]
    dist.all_to_all(outputs, inputs, group=group)
    return [tensor_bytes(o) for o in outputs]


_LIST_FORMS = [
    "separate tensors",
    "the inputs as outputs",
    "outputs as views of one tensor",
    "a non-contiguous output",
]


@pytest.fixture(params=["peer to peer", "one Ialltoallv"])
def list_path(request, monkeypatch):
    """Each path of ``all_to_all`` and of ``all_to_all_single`` with split sizes: the one for
    groups of a node's size, and the one for larger groups (forced on every rank alike)."""
    if request.param == "one Ialltoallv":
        monkeypatch.setattr(policy, "PAIRWISE_MAX_RANKS", 0)
    return request.param


@pytest.mark.parametrize("form", _LIST_FORMS)
@pytest.mark.parametrize("count", [1, 70001])
def test_all_to_all_lists_have_gloos_bytes(comm, groups, form, count, list_path, need_gloo):
    """One message each way per peer straight between the tensors, or through copies where the
    outputs share memory or are not contiguous; or one ``Ialltoallv``: gloo's bytes, each rank's
    values where they belong."""
    need_gloo("alltoall")
    size, rank = comm.size, comm.rank
    ours = _all_to_all_list(None, rank, size, count, form)
    assert ours == _all_to_all_list(groups[1], rank, size, count, form)
    expected = [rank_values(j * size + rank, count, torch.float32) for j in range(size)]
    assert ours == [tensor_bytes(e) for e in expected]


@pytest.mark.parametrize("form", [f for f in _LIST_FORMS if f != "the inputs as outputs"])
def test_all_to_all_lists_of_sizes_that_differ_by_peer(comm, form, list_path):
    """Rank ``r`` sends rank ``j`` ``70001 + j`` values (gloo takes equal sizes only)."""
    size, rank = comm.size, comm.rank
    ours = _all_to_all_list(None, rank, size, 70001, form, grow=1)
    expected = [rank_values(j * size + rank, 70001 + rank, torch.float32) for j in range(size)]
    assert ours == [tensor_bytes(e) for e in expected]


def test_in_place_forms_on_some_ranks_only_at_large_sizes(comm):
    """Where only rank 0 passes aliased buffers, every rank runs the plain form (no rank's
    point-to-point messages meet another's collective)."""
    size, rank = comm.size, comm.rank
    count = 65537
    data = rank_values(rank, count * size, torch.float32, exact=True)
    whole = data.clone()
    out = whole.chunk(size)[rank] if rank == 0 else torch.empty(count)
    dist.reduce_scatter_tensor(out, whole)
    expected = sum(rank_values(r, count * size, torch.float32, True) for r in range(size))
    assert torch.equal(out, expected.chunk(size)[rank])
    one = data.clone()
    out = one if rank == 0 else torch.empty_like(one)
    dist.all_to_all_single(out, one)
    every = [rank_values(r, count * size, torch.float32, True) for r in range(size)]
    assert torch.equal(out, torch.cat([e.chunk(size)[rank] for e in every]))


def test_many_in_place_operations_in_flight(comm):
    """Asynchronous in-place forms issued back to back complete in order with their bytes."""
    size, rank = comm.size, comm.rank
    tensors = [rank_values(rank, 9 * size, torch.float64, exact=True) + i for i in range(6)]
    expected = [
        sum(rank_values(r, 9 * size, torch.float64, True) + i for r in range(size))
        for i in range(6)
    ]
    works, blocks = [], []
    for i, t in enumerate(tensors):
        if i % 2:
            works.append(dist.all_to_all_single(t, t, async_op=True))
        else:
            blocks.append(t.chunk(size)[rank])
            works.append(dist.reduce_scatter_tensor(blocks[-1], t, async_op=True))
    for w in works:
        w.wait()
    for i, t in enumerate(tensors):
        if i % 2:
            every = [rank_values(r, 9 * size, torch.float64, True) + i for r in range(size)]
            assert torch.equal(t, torch.cat([e.chunk(size)[rank] for e in every]))
        else:
            assert torch.equal(t.chunk(size)[rank], expected[i].chunk(size)[rank])
