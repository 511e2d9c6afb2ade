"""Accelerate on the CPU: the default group made first (``mpisync.torch.init_process_group()``,
or gloo's), then ``Accelerator(cpu=True)`` takes it (Accelerate itself refuses
``backend="mpisync"`` on the CPU)."""

import torch
from accelerate import Accelerator

import common

if common.backend() == "gloo":  # mpisync takes rank and size from MPI
    common.rendezvous_env()
common.init()
accelerator = Accelerator(cpu=True)
net = common.model()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
net, optimizer = accelerator.prepare(net, optimizer)
losses = []
for x, y in common.batches():
    loss = torch.nn.functional.mse_loss(net(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
common.report("accelerate-ddp", accelerator.unwrap_model(net).parameters(), losses)
common.finish()
