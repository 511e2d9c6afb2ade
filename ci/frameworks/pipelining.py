"""torch.distributed.pipelining's ScheduleGPipe: one stage per rank, point-to-point between
them."""

import torch
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import common

common.init()
torch.manual_seed(0)
layers = [torch.nn.Linear(32, 32) for _ in range(common.SIZE)]
stage_module = layers[common.RANK]
stage = PipelineStage(stage_module, common.RANK, common.SIZE, torch.device("cpu"))
last = common.RANK == common.SIZE - 1


def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)


schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(1)
losses = []
for _ in range(3):
    x, y = torch.randn(16, 32, generator=generator), torch.randn(16, 32, generator=generator)
    step_losses: list = []
    if common.RANK == 0:
        schedule.step(x, target=y if last else None, losses=step_losses if last else None)
    elif last:
        schedule.step(target=y, losses=step_losses)
    else:
        schedule.step()
    optimizer.step()
    optimizer.zero_grad()
    losses += [float(loss) for loss in step_losses]
common.report("pipelining-gpipe", stage_module.parameters(), losses)
common.finish()
