"""DeepSpeed ZeRO stage 1, 2 or 3 on the CPU (``DS_ACCELERATOR=cpu``) with a torch optimizer,
``deepspeed.init_distributed(dist_backend=BACKEND)``."""

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402

import common  # noqa: E402

stage = int(common.variant("1"))
if common.backend() == "gloo":  # mpisync takes rank and size from MPI
    common.rendezvous_env()
if common.backend() == "mpisync":
    import mpisync.torch  # noqa: F401  (registers the backend)
deepspeed.init_distributed(dist_backend=common.backend())
net = common.model()
config = {
    "train_micro_batch_size_per_gpu": 16,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": stage},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
}
optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
engine, _, _, _ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
losses = []
for x, y in common.batches():
    loss = torch.nn.functional.mse_loss(engine(x), y)
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
if stage == 3:
    from deepspeed.utils import safe_get_full_fp32_param

    tensors = [safe_get_full_fp32_param(p) for p in engine.module.parameters()]
else:
    tensors = list(engine.module.parameters())
common.report(f"deepspeed-zero{stage}", tensors, losses)
common.finish()
