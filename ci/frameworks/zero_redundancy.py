"""DDP with torch's ZeroRedundancyOptimizer (its state sharded, parameters broadcast)."""

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

import common

common.init()
net = common.model()
ddp = torch.nn.parallel.DistributedDataParallel(net)
optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
losses = common.train(ddp, optimizer)
optimizer.consolidate_state_dict(to=0)
common.report("zero-redundancy", net.parameters(), losses)
common.finish()
