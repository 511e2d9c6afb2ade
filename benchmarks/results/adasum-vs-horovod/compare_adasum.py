"""Adasum side by side: run under real Horovod (mpiexec -n N python compare_adasum.py OUT.npz)
and under mpisync (mpiexec -n N python -m mpisync.horovod compare_adasum.py OUT.npz); rank 0
saves every result; diff_adasum.py compares the two files."""

import sys

import horovod.torch as hvd
import numpy as np
import torch

hvd.init()
rank, size = hvd.rank(), hvd.size()
out = {}


def inputs(seed, dtype, shapes):
    g = torch.Generator().manual_seed(1000 * seed + rank)
    return [
        (torch.randn(s, generator=g, dtype=torch.float64) * (1 + rank)).to(dtype) for s in shapes
    ]


def keep(key, tensor):
    gathered = hvd.allgather(tensor.detach().reshape(1, -1).to(torch.float64))
    out[key] = gathered.numpy()  # every rank's result: they must be equal too


shapes = [(7,), (33, 5), (1,), (4, 4, 3), (1000,), (2, 1023)]
for k, dtype in enumerate([torch.float32, torch.float64, torch.float16]):
    for i, t in enumerate(inputs(k, dtype, shapes)):
        keep(f"allreduce/{dtype}/{i}", hvd.allreduce(t, op=hvd.Adasum, name=f"a{k}.{i}"))
mixed = inputs(7, torch.float32, [(5,), (300,)]) + inputs(8, torch.float16, [(17,), (257,)])
mixed += inputs(9, torch.float64, [(64,)])
for i, t in enumerate(hvd.grouped_allreduce(mixed, op=hvd.Adasum, name="g")):
    keep(f"grouped/{i}", t)
for i, t in enumerate(
    hvd.grouped_allreduce(
        mixed, op=hvd.Adasum, name="gs", prescale_factor=0.5, postscale_factor=3.0
    )
):
    keep(f"grouped_scaled/{i}", t)
zero = torch.zeros(9) if rank == 0 else torch.arange(9.0) * (rank + 1)
keep("zero_on_rank0", hvd.allreduce(zero, op=hvd.Adasum, name="z"))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(6, 5)
        self.b = torch.nn.Linear(5, 1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def train(tag, compression, passes):
    net = Net()
    sgd = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    try:
        opt = hvd.DistributedOptimizer(
            sgd,
            named_parameters=net.named_parameters(),
            op=hvd.Adasum,
            compression=compression,
            backward_passes_per_step=passes,
        )
    except ValueError:  # mpisync before the dispatch in optimizer.py: the wrapper itself
        from mpisync.horovod.adasum_optimizer import adasum_distributed_optimizer

        opt = adasum_distributed_optimizer(sgd, net.named_parameters(), compression, passes, None)
    for step in range(3):
        opt.zero_grad()
        for k in range(passes):
            g = torch.Generator().manual_seed(100 * rank + 10 * step + k)
            x, y = torch.randn(8, 6, generator=g), torch.randn(8, 1, generator=g)
            torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    for name, p in net.named_parameters():
        keep(f"optimizer/{tag}/{name}", p)


train("plain", hvd.Compression.none, 1)
train("passes2", hvd.Compression.none, 2)
train("fp16", hvd.Compression.fp16, 1)
if rank == 0:
    np.savez(sys.argv[1], **out)
    print("saved", len(out), "results to", sys.argv[1], "with", hvd.__name__)
hvd.shutdown()
