"""Lightning under mpiexec (``MPIEnvironment``) on either backend: ``ddp`` (``DDPStrategy``),
``fsdp2`` and ``tp`` (``ModelParallelStrategy`` with ``fully_shard`` or tensor parallelism)."""

import lightning as L
import torch
from lightning.fabric.plugins.environments import MPIEnvironment

import common

kind = common.variant("ddp")
if common.backend() == "gloo":  # mpisync takes rank and size from MPI
    common.rendezvous_env()
if common.backend() == "mpisync":
    import mpisync.torch  # noqa: F401  (registers the backend)


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = common.model()
        self.losses: list = []

    def configure_model(self):
        mesh = self.device_mesh
        if kind == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh["data_parallel"])
            fully_shard(self.net, mesh=mesh["data_parallel"])
        elif kind == "tp":
            from torch.distributed.tensor.parallel import (
                ColwiseParallel,
                RowwiseParallel,
                parallelize_module,
            )

            plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
            parallelize_module(self.net, mesh["tensor_parallel"], plan)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


generator = torch.Generator().manual_seed(1)
data = torch.utils.data.TensorDataset(
    torch.randn(128, 32, generator=generator), torch.randn(128, 8, generator=generator)
)
loader = torch.utils.data.DataLoader(data, batch_size=16, shuffle=False)
if kind == "ddp":
    strategy = L.pytorch.strategies.DDPStrategy(process_group_backend=common.backend())
else:
    dp, tp = (common.SIZE, 1) if kind == "fsdp2" else (1, common.SIZE)
    strategy = L.pytorch.strategies.ModelParallelStrategy(
        data_parallel_size=dp, tensor_parallel_size=tp, process_group_backend=common.backend()
    )
trainer = L.Trainer(
    accelerator="cpu",
    devices=common.SIZE,
    num_nodes=1,
    strategy=strategy,
    plugins=[MPIEnvironment()],
    max_epochs=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
module = Net()
trainer.fit(module, loader)
tensors = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in module.parameters()]
common.report(f"lightning-{kind}", tensors, module.losses)
common.finish()
