"""mpisync.GradOverlap: a plain torch model's gradients reduced during backward give the same
parameters, bit for bit, as GradSync at the step, and buckets do start during backward.

With three ranks or more the order of the additions belongs to the transport, so only ranks 0
and 1 contribute non-zero gradients there: adding zeros in any order leaves the same bits."""

import pytest

import mpisync

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.mpi

STEPS = 5
FUSION = 100  # bytes: a bucket per gradient or two


class Mlp(torch.nn.Module):
    def __init__(self, extra: bool = False):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh()
        )
        self.head = torch.nn.Linear(16, 4)
        if extra:
            self.some_ranks = torch.nn.Parameter(torch.ones(4))  # no gradient on rank 0
            self.unused = torch.nn.Parameter(torch.ones(3))  # no gradient anywhere

    def forward(self, x, rank):
        out = self.head(self.layers(x))
        if hasattr(self, "some_ranks") and rank != 0:
            out = out * self.some_ranks
        return out


def backward(model, comm, step, k, dtype):
    data = torch.Generator().manual_seed(1000 * step + 10 * comm.rank + k)
    x = torch.randn(6, 8, generator=data).to(dtype)
    scale = 1.0 if comm.rank < 2 else 0.0
    (model(x, comm.rank).square().sum() * scale).backward()


def train(comm, reduce_with, op="avg", passes=1, dtype=torch.float32, extra=False):
    """Five SGD steps; ``reduce_with`` is "overlap" or "gradsync". The model and the count of
    buckets started during backward."""
    torch.manual_seed(0)
    model = Mlp(extra).to(dtype)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    overlap = mpisync.GradOverlap(
        model, comm, op=op, fusion_bytes=FUSION, backward_passes_per_step=passes
    )
    if reduce_with != "overlap":
        overlap.close()  # no hooks: the reference reduces at the step
    with mpisync.GradSync(comm, op=op) as reducer:
        for step in range(STEPS):
            sgd.zero_grad()
            for k in range(passes):
                backward(model, comm, step, k, dtype)
            if reduce_with == "overlap":
                overlap.finish()
            else:
                grads = {n: p.grad for n, p in model.named_parameters()}
                if extra:  # zeros where this rank has none, None where every rank has none
                    grads["some_ranks"] = model.some_ranks.grad
                    if grads["some_ranks"] is None and comm.size > 1:
                        grads["some_ranks"] = model.some_ranks.grad = torch.zeros(4, dtype=dtype)
                reducer.allreduce(grads)
            sgd.step()
    early = overlap.started_early
    overlap.close()
    return model, early


@pytest.mark.parametrize(
    "options",
    [{}, {"op": "sum"}, {"passes": 2}, {"dtype": torch.float64}, {"dtype": torch.float16}],
    ids=["avg", "sum", "two-passes", "float64", "float16"],
)
def test_same_bits_as_gradsync_at_the_step(comm, options):
    on, early = train(comm, "overlap", **options)
    off, _ = train(comm, "gradsync", **options)
    for (name, a), b in zip(on.named_parameters(), off.parameters()):
        assert torch.equal(a, b), name
    assert early >= STEPS - 1  # from the second step on, buckets started during backward


def test_none_gradients(comm):
    on, _ = train(comm, "overlap", extra=True)
    off, _ = train(comm, "gradsync", extra=True)
    for (name, a), b in zip(on.named_parameters(), off.parameters()):
        assert torch.equal(a, b), name
    assert on.unused.grad is None  # None on every rank stays None
    if comm.size > 1:
        assert on.some_ranks.grad is not None  # rank 0 had none: the others' average reached it


def test_sum_of_known_values(comm):
    """The values themselves: a parameter whose gradient is its rank + 1 sums to the triangle
    number, from a hook (second step) as at the first step."""
    weight = torch.nn.Parameter(torch.zeros(3))
    with mpisync.GradOverlap([("w", weight)], comm, op="sum") as overlap:
        for _ in range(2):
            weight.grad = None
            (weight * (comm.rank + 1.0)).sum().backward()
            overlap.finish()
            total = comm.size * (comm.size + 1) / 2
            assert weight.grad.tolist() == [total] * 3
        assert overlap.started_early == 0  # one bucket: nothing to overlap with


def test_refuses_bad_settings(comm):
    weight = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(mpisync.InvalidParamError, match="op"):
        mpisync.GradOverlap([("w", weight)], comm, op="max")
    with pytest.raises(mpisync.InvalidParamError, match="fusion_bytes"):
        mpisync.GradOverlap([("w", weight)], comm, fusion_bytes=-1)


@pytest.mark.parametrize(
    ("argument", "environment", "caps"),
    [
        (None, None, (1 << 20, 25 << 20)),  # DDP's buckets
        (4096, None, (4096, 4096)),
        (None, "8192", (8192, 8192)),
        (4096, "8192", (4096, 4096)),
    ],
)
def test_bucket_caps(monkeypatch, argument, environment, caps):
    from mpisync.allreduce.buckets import bucket_caps
    from mpisync.config import resolve

    if environment is None:
        monkeypatch.delenv("MPISYNC_FUSION_BYTES", raising=False)
    else:
        monkeypatch.setenv("MPISYNC_FUSION_BYTES", environment)
    assert bucket_caps(resolve(fusion_bytes=argument).fusion_bytes) == caps


def test_default_layout_is_ddps():
    """Backward's first gradients fill a bucket of at most 1 MiB, then buckets of 25 MiB; a
    gradient larger than its cap has a bucket of its own."""
    from mpisync.allreduce.buckets import DEFAULT_BUCKETS, _layout

    mib = 1 << 18  # float32 elements in a MiB
    numels = [3 * mib, 10 * mib, 10 * mib, 10 * mib, 8 * mib, mib // 2, mib // 4, mib // 4]
    packed = [(torch.zeros(n), True) for n in numels]
    buckets = _layout(packed, DEFAULT_BUCKETS)
    assert [[slot[0] for slot in b.slots] for b in buckets] == [[7, 6, 5], [4, 3], [2, 1, 0]]
    assert [len(b.array) for b in buckets] == [mib + 3, 18 * mib + 2, 23 * mib + 3]
    alone = _layout([(torch.zeros(2 * mib), True), (torch.zeros(30 * mib), True)], DEFAULT_BUCKETS)
    assert [[slot[0] for slot in b.slots] for b in alone] == [[1], [0]]
