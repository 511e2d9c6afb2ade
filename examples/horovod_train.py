"""A Horovod PyTorch training script, run on mpisync: only the import line differs from Horovod.

    mpiexec -n 2 python examples/horovod_train.py --epochs 2

Written as Horovod's documentation shows a PyTorch script: ``hvd.init()``, the learning rate
scaled by ``hvd.size()``, a ``DistributedSampler`` giving each rank its share of the data,
``hvd.DistributedOptimizer`` with ``named_parameters``, ``broadcast_parameters`` and
``broadcast_optimizer_state`` from rank 0, and ``hvd.allreduce`` averaging the test metrics.
The data is made in memory (a fixed random teacher labels random points), so nothing is
downloaded. ``--save`` writes the final parameters (rank 0, ``.npz``); every rank prints a
digest of its parameters at the end.
"""

import argparse
import hashlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed

import mpisync.horovod as hvd  # Horovod: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="Horovod-style PyTorch training on synthetic data")
parser.add_argument("--batch-size", type=int, default=16, help="input batch size per rank")
parser.add_argument("--test-batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--samples", type=int, default=512, help="training samples in all")
parser.add_argument("--log-interval", type=int, default=8)
parser.add_argument("--fp16-allreduce", action="store_true", help="fp16 compression")
parser.add_argument("--use-adasum", action="store_true", help="Adasum reduction")
parser.add_argument("--save", help="write the final parameters here (rank 0, .npz)")
args = parser.parse_args()

hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)


TEACHER = torch.randn(20, 4, generator=torch.Generator().manual_seed(0))


def make_data(samples: int, seed: int):
    inputs = torch.randn(samples, 20, generator=torch.Generator().manual_seed(seed))
    labels = (inputs @ TEACHER).argmax(dim=1)
    return torch.utils.data.TensorDataset(inputs, labels)


train_dataset = make_data(args.samples, seed=1)
test_dataset = make_data(256, seed=2)
# Each rank takes its share of the samples: DistributedSampler with Horovod's rank and size.
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
)
train_loader = torch.utils.data.DataLoader(
    train_dataset, batch_size=args.batch_size, sampler=train_sampler
)
test_sampler = torch.utils.data.distributed.DistributedSampler(
    test_dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
)
test_loader = torch.utils.data.DataLoader(
    test_dataset, batch_size=args.test_batch_size, sampler=test_sampler
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


model = Net()
# Horovod: scale the learning rate by the number of workers (Adasum does not need it).
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)

# Horovod: start every rank from rank 0's parameters and optimizer state; resume from its epoch.
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
resume_from_epoch = hvd.broadcast_object(0, root_rank=0, name="resume_from_epoch")

compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)


def train(epoch):
    model.train()
    train_sampler.set_epoch(epoch)  # the same shuffle on every rank, a new one each epoch
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
            print(
                f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_sampler)}]"
                f"\tLoss: {loss.item():.6f}",
                flush=True,
            )


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def test():
    model.eval()
    test_loss, test_accuracy = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.cross_entropy(output, target, reduction="sum").item()
            test_accuracy += output.argmax(dim=1).eq(target).float().sum().item()
    test_loss = metric_average(test_loss / len(test_sampler), "avg_loss")
    test_accuracy = metric_average(test_accuracy / len(test_sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(
            f"Test set: Average loss: {test_loss:.4f}, Accuracy: {100.0 * test_accuracy:.2f}%",
            flush=True,
        )


for epoch in range(resume_from_epoch + 1, args.epochs + 1):
    train(epoch)
    test()

state = {name: t.detach().numpy().copy() for name, t in model.state_dict().items()}
digest = hashlib.blake2b(b"".join(state[n].tobytes() for n in sorted(state)), digest_size=8)
print(f"rank {hvd.rank()}/{hvd.size()}: parameters {digest.hexdigest()}", flush=True)
if args.save and hvd.rank() == 0:
    np.savez(args.save, **state)
hvd.shutdown()
