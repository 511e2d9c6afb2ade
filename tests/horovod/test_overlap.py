"""DistributedOptimizer's overlap: buckets started from backward hooks give the same parameters,
bit for bit, as the reduction at ``step()`` (``overlap=False``), and do start during backward.

With three ranks or more the order of the additions belongs to MPI's algorithm for each
bucket's size, so only ranks 0 and 1 of the set contribute
non-zero gradients there: adding zeros in any order leaves the same bits."""

import pytest

hvd = pytest.importorskip("mpisync.horovod")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi

STEPS = 5
FUSION = 100  # bytes: several buckets even for the small models here


class Mlp(torch.nn.Module):
    def __init__(self, extra: bool = False):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU()
        )
        self.head = torch.nn.Linear(16, 4)
        if extra:
            self.some_ranks = torch.nn.Parameter(torch.ones(4))  # no gradient on rank 0
            self.unused = torch.nn.Parameter(torch.ones(3))  # no gradient anywhere

    def forward(self, x, rank):
        out = self.head(self.body(x))
        if hasattr(self, "some_ranks") and rank != 0:
            out = out * self.some_ranks
        return out


class Sparse(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8, sparse=True)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x, rank):
        ids = (x[:, 0].abs() * 10).long() % 10
        return self.head(self.embed(ids) + x)


def weight(comm, members=None) -> float:
    """1 on the first two ranks of the set (every rank with one or two), else 0."""
    members = list(range(comm.size)) if members is None else members
    return 1.0 if comm.rank in members[:2] or comm.size <= 2 else 0.0


def train(comm, make, overlap, passes=1, members=None, **options):
    torch.manual_seed(0)
    model = make()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    opt = hvd.DistributedOptimizer(
        sgd,
        named_parameters=model.named_parameters(),
        backward_passes_per_step=passes,
        overlap=overlap,
        fusion_bytes=FUSION,
        **options,
    )
    scale = weight(comm, members)
    for step in range(STEPS):
        opt.zero_grad()
        for k in range(passes):
            data = torch.Generator().manual_seed(1000 * step + 10 * comm.rank + k)
            x = torch.randn(6, 8, generator=data)
            (model(x, comm.rank).square().sum() * scale).backward()
        opt.step()
    return model, opt


def assert_same(comm, make, members=None, **options):
    """Train with and without overlap; the parameters are the same bits, and buckets started
    while backward still had gradients to give."""
    on, opt = train(comm, make, True, members=members, **options)
    off, _ = train(comm, make, False, members=members, **options)
    for (name, a), b in zip(on.named_parameters(), off.parameters()):
        assert torch.equal(a, b), name
        assert (a.grad is None) == (b.grad is None), name
    state = opt._mpisync
    if state.comm is not None:  # a rank of the set
        assert state.buckets is not None and state.buckets.early >= STEPS - 1
    return on


def test_mlp_sgd(started):
    assert_same(started, Mlp)


def test_backward_passes_per_step(started):
    assert_same(started, Mlp, passes=2)


def test_fp16_compression(started):
    assert_same(started, Mlp, compression=hvd.Compression.fp16)


def test_none_gradients(started):
    model = assert_same(started, lambda: Mlp(extra=True))
    assert model.unused.grad is None  # None on every rank stays None
    if started.size > 1:  # rank 0 had none; the others' reduced values reach it
        assert model.some_ranks.grad is not None


def test_sparse_embedding(started):
    assert_same(started, Sparse)


def test_sparse_as_dense(started):
    assert_same(started, Sparse, sparse_as_dense=True)


def test_sum(started):
    assert_same(started, Mlp, op=hvd.Sum)


def test_predivide(started):
    assert_same(started, Mlp, gradient_predivide_factor=2.0)


def test_process_set(started):
    if started.size < 3:
        pytest.skip("a proper subset of ranks needs three")
    members = [0, started.size - 1]
    subset = hvd.add_process_set(members)
    try:
        assert_same(started, Mlp, members=members, process_set=subset)
    finally:
        hvd.remove_process_set(subset)


def test_overlap_starts_buckets_before_backward_ends(started):
    """Bucket starts seen from the last hook of backward: all but the last bucket are in
    flight before the first layer's gradients exist."""
    torch.manual_seed(0)
    model = Mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        fusion_bytes=FUSION,
    )
    buckets = opt._mpisync.buckets
    first = model.body[0].weight  # the last gradient backward gives
    seen = []
    first.register_post_accumulate_grad_hook(lambda p: seen.append(buckets.next))
    x = torch.ones(2, 8)
    for _ in range(2):
        opt.zero_grad()
        model(x, started.rank).sum().backward()
        opt.step()
    assert len(buckets.buckets) > 2
    # step 1 lays the buckets out; in step 2, before the first layer's hook, the rest started
    assert seen[0] == 0 and seen[1] >= len(buckets.buckets) - 2


def test_too_many_backward_passes_raise_as_in_horovod(started):
    torch.manual_seed(0)
    model = Mlp()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        fusion_bytes=FUSION,
    )
    x = torch.ones(2, 8)
    model(x, 0).sum().backward()
    opt.step()  # lays the buckets out
    opt.zero_grad()
    for _ in range(2):
        model(x, 0).sum().backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        opt.step()
    opt.zero_grad()
    model(x, 0).sum().backward()
    opt.step()  # the next step is fine again
