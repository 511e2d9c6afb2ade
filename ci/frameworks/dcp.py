"""torch.distributed.checkpoint on either backend: ``sync-plain``, ``async-plain`` (a replicated
model), ``sync-fsdp2``, ``async-fsdp2`` (sharded DTensors): train, save, load into a fresh model,
report what was loaded."""

import os
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import fully_shard

import common

common.init()
how, layout = common.variant("sync-plain").split("-")


def made() -> torch.nn.Module:
    net = common.model()
    if layout == "fsdp2":
        for layer in net:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(net)
    return net


net = made()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
for x, y in common.batches(2, same=True):
    torch.nn.functional.mse_loss(net(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
folder = os.path.join(os.environ.get("FRAMEWORKS_TMP", tempfile.gettempdir()), "dcp")
state = get_model_state_dict(net)
if how == "async":
    dcp.async_save(state, checkpoint_id=folder).result()
else:
    dcp.save(state, checkpoint_id=folder)
fresh = made()
loaded = get_model_state_dict(fresh)
dcp.load(loaded, checkpoint_id=folder)
set_model_state_dict(fresh, loaded)
tensors = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in fresh.parameters()]
common.report(f"dcp-{how}-{layout}", tensors, [])
common.finish()
