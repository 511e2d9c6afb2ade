"""torch FSDP2 (``fully_shard``) on either backend: in-place all-gathers and reduce-scatters."""

import torch
from torch.distributed.fsdp import fully_shard

import common

common.init()
net = common.model()
for layer in net:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(net)
optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
losses = common.train(net, optimizer)
common.report("fsdp2", [p.full_tensor() for p in net.parameters()], losses)
common.finish()
