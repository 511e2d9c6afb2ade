"""Hugging Face Transformers' ``Trainer`` on the CPU: the default group made first
(``mpisync.torch.init_process_group()``, or gloo's), then ``TrainingArguments(use_cpu=True)``:
Trainer's Accelerate takes the group and wraps the model in DDP. A tiny BERT made from a config
(nothing downloaded), ten steps on the same synthetic data on every rank (Trainer's distributed
sampler gives each rank its share).

``ddp_backend="mpisync"`` is refused by Accelerate on the CPU, and without ``use_cpu=True``
Trainer finds no GPU and trains each rank alone: docs/frameworks.md says so."""

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

import common

if common.backend() == "gloo":  # mpisync takes rank and size from MPI
    common.rendezvous_env()
common.init()
config = BertConfig(
    vocab_size=64,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=32,
)
torch.manual_seed(0)
model = BertForSequenceClassification(config)
generator = torch.Generator().manual_seed(7)
data = [
    {
        "input_ids": torch.randint(0, config.vocab_size, (16,), generator=generator),
        "attention_mask": torch.ones(16, dtype=torch.int64),
        "labels": torch.randint(0, 2, (), generator=generator),
    }
    for _ in range(80)
]
arguments = TrainingArguments(
    output_dir=common.os.environ.get("FRAMEWORKS_TMP", "."),
    use_cpu=True,
    per_device_train_batch_size=4,
    max_steps=10,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to=[],
    seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)
trainer = Trainer(model=model, args=arguments, train_dataset=data)
assert trainer.args.world_size == common.SIZE, (trainer.args.world_size, common.SIZE)
trainer.train()
assert isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)
losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
assert len(losses) == 10, trainer.state.log_history
common.report("hf-trainer", trainer.model.parameters(), losses)
common.finish()
