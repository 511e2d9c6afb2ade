"""DDP on either backend: ``powersgd`` (PowerSGD's comm hook: callbacks that issue and wait on
collectives), ``fp16`` (fp16_compress_hook), ``static`` (static_graph), ``no-sync``
(gradient accumulation under no_sync)."""

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

import common

common.init()
kind = common.variant("powersgd")
net = common.model()
ddp = torch.nn.parallel.DistributedDataParallel(net, static_graph=kind == "static")
if kind == "powersgd":
    state = powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=2,
        start_powerSGD_iter=2,
        min_compression_rate=0.5,
    )
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
elif kind == "fp16":
    ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
losses = []
for step, (x, y) in enumerate(common.batches(6)):
    if kind == "no-sync" and step % 2 == 0:
        with ddp.no_sync():
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        continue
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
common.report(f"ddp-{kind}", net.parameters(), losses)
common.finish()
