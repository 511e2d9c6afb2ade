"""0-row tensors in the Horovod collectives that take rows: Horovod's answers (a rank with no
rows contributes nothing to an allgather, sends or receives nothing in an alltoall, and gets an
empty block of a reducescatter). Values checked exactly, at 1-3 ranks."""

import pytest

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

from mpisync.transports import policy  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(params=["peer to peer", "one Ialltoallv"])
def alltoall_path(request, monkeypatch):
    """Each path of ``alltoall``, forced on every rank alike."""
    if request.param == "one Ialltoallv":
        monkeypatch.setattr(policy, "PAIRWISE_MAX_RANKS", 0)
    return request.param


def _rows(rank: int, count: int, width: int = 3, dtype=torch.int32):
    """``count`` rows of ``width`` values, each naming the rank and its row."""
    return (
        torch.arange(count * width, dtype=dtype).reshape(count, width) + 1000 * (rank + 1)
        if count
        else torch.empty(0, width, dtype=dtype)
    )


def test_allgather_where_some_ranks_have_no_rows(started):
    """Rank r contributes r rows: rank 0 contributes nothing."""
    n, r = started.size, started.rank
    got = hvd.allgather(_rows(r, r))
    expected = torch.cat([_rows(j, j) for j in range(n)])
    assert got.shape == (n * (n - 1) // 2, 3) and got.dtype == torch.int32
    assert torch.equal(got, expected)


def test_allgather_where_every_rank_has_no_rows(started):
    got = hvd.allgather(torch.empty(0, 2, 5, dtype=torch.float64))
    assert got.shape == (0, 2, 5) and got.dtype == torch.float64
    got = hvd.allgather(torch.empty(0))
    assert got.shape == (0,)


def test_grouped_allgather_with_empty_members(started):
    n, r = started.size, started.rank
    a, b, c = hvd.grouped_allgather([_rows(r, r), torch.empty(0, 4), _rows(r, 1, 2, torch.float16)])
    assert torch.equal(a, torch.cat([_rows(j, j) for j in range(n)]))
    assert b.shape == (0, 4)
    assert torch.equal(c, torch.cat([_rows(j, 1, 2, torch.float16) for j in range(n)]))


def test_allgather_of_no_rows_is_differentiable(started):
    r = started.rank
    x = _rows(r, r, dtype=torch.float64).requires_grad_()
    out = hvd.allgather(x)
    out.sum().backward()
    assert x.grad.shape == x.shape and torch.equal(x.grad, torch.ones_like(x))


def test_alltoall_of_no_rows(started, alltoall_path):
    n = started.size
    out, received = hvd.alltoall(torch.empty(0, 3, dtype=torch.int64), splits=[0] * n)
    assert out.shape == (0, 3) and out.dtype == torch.int64
    assert received.tolist() == [0] * n
    out = hvd.alltoall(torch.empty(0, 3))  # equal parts of nothing
    assert out.shape == (0, 3)


def test_alltoall_where_one_rank_sends_nothing(started, alltoall_path):
    """Rank 0 has no rows (splits of zeros); every other rank sends each rank one row."""
    n, r = started.size, started.rank
    tensor = _rows(r, 0 if r == 0 else n)
    out, received = hvd.alltoall(tensor, splits=[0 if r == 0 else 1] * n)
    assert received.tolist() == [0] + [1] * (n - 1)
    expected = torch.cat(
        [torch.empty(0, 3, dtype=torch.int32)] + [_rows(j, n)[r : r + 1] for j in range(1, n)]
    )
    assert torch.equal(out, expected)


def test_reducescatter_of_no_rows(started):
    got = hvd.reducescatter(torch.empty(0, 3), op=hvd.Sum)
    assert got.shape == (0, 3)
    a, b = hvd.grouped_reducescatter([torch.empty(0, 2), torch.ones(0)], op=hvd.Average)
    assert a.shape == (0, 2) and b.shape == (0,)


def test_reducescatter_of_fewer_rows_than_ranks(started):
    """One row over n ranks: rank 0 gets it reduced, the others an empty block."""
    n, r = started.size, started.rank
    x = torch.tensor([[r + 1.0, 2.0 * (r + 1)]], dtype=torch.float64)
    got = hvd.reducescatter(x, op=hvd.Sum)
    total = n * (n + 1) / 2
    if r == 0:
        assert torch.equal(got, torch.tensor([[total, 2 * total]], dtype=torch.float64))
    else:
        assert got.shape == (0, 2)
