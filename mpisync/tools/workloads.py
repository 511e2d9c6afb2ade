"""Parameter sets with the shapes of published architectures (nothing is downloaded).

Each workload is a dict ``name -> (shape, dtype)`` named as torchvision and
Hugging Face name them, used by the demo job and by ``mpisync bench``.
"""

from __future__ import annotations

import numpy as _np

__all__ = ["WORKLOADS", "workload", "make_params"]


def _bn(prefix: str, n: int) -> dict:
    out: dict[str, tuple[tuple[int, ...], str]] = {
        f"{prefix}.{k}": ((n,), "float32")
        for k in ("weight", "bias", "running_mean", "running_var")
    }
    out[f"{prefix}.num_batches_tracked"] = ((), "int64")
    return out


def resnet50() -> dict:
    """ResNet-50 (He et al. 2015, torchvision layout): 25.6 M parameters plus BatchNorm buffers."""
    shapes = {"conv1.weight": ((64, 3, 7, 7), "float32"), **_bn("bn1", 64)}
    inplanes = 64
    for layer, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3)), start=1):
        for b in range(blocks):
            p = f"layer{layer}.{b}"
            shapes[f"{p}.conv1.weight"] = ((planes, inplanes, 1, 1), "float32")
            shapes.update(_bn(f"{p}.bn1", planes))
            shapes[f"{p}.conv2.weight"] = ((planes, planes, 3, 3), "float32")
            shapes.update(_bn(f"{p}.bn2", planes))
            shapes[f"{p}.conv3.weight"] = ((planes * 4, planes, 1, 1), "float32")
            shapes.update(_bn(f"{p}.bn3", planes * 4))
            if b == 0:
                shapes[f"{p}.downsample.0.weight"] = ((planes * 4, inplanes, 1, 1), "float32")
                shapes.update(_bn(f"{p}.downsample.1", planes * 4))
            inplanes = planes * 4
    shapes["fc.weight"] = ((1000, 2048), "float32")
    shapes["fc.bias"] = ((1000,), "float32")
    return shapes


def _ln(prefix: str, n: int) -> dict:
    return {f"{prefix}.weight": ((n,), "float32"), f"{prefix}.bias": ((n,), "float32")}


def _dense(prefix: str, n_out: int, n_in: int) -> dict:
    return {f"{prefix}.weight": ((n_out, n_in), "float32"), f"{prefix}.bias": ((n_out,), "float32")}


def bert_base() -> dict:
    """BERT-base uncased (Devlin et al. 2018, Hugging Face layout): 110 M parameters."""
    h, ff = 768, 3072
    shapes = {
        "embeddings.word_embeddings.weight": ((30522, h), "float32"),
        "embeddings.position_embeddings.weight": ((512, h), "float32"),
        "embeddings.token_type_embeddings.weight": ((2, h), "float32"),
        **_ln("embeddings.LayerNorm", h),
    }
    for i in range(12):
        p = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            shapes.update(_dense(f"{p}.attention.self.{part}", h, h))
        shapes.update(_dense(f"{p}.attention.output.dense", h, h))
        shapes.update(_ln(f"{p}.attention.output.LayerNorm", h))
        shapes.update(_dense(f"{p}.intermediate.dense", ff, h))
        shapes.update(_dense(f"{p}.output.dense", h, ff))
        shapes.update(_ln(f"{p}.output.LayerNorm", h))
    shapes.update(_dense("pooler.dense", h, h))
    return shapes


def gpt2_small() -> dict:
    """GPT-2 small (Radford et al. 2019, Hugging Face layout, Conv1D weights): 124 M parameters."""
    h = 768
    shapes: dict[str, tuple[tuple[int, ...], str]] = {
        "wte.weight": ((50257, h), "float32"),
        "wpe.weight": ((1024, h), "float32"),
    }
    for i in range(12):
        p = f"h.{i}"
        shapes.update(_ln(f"{p}.ln_1", h))
        shapes[f"{p}.attn.c_attn.weight"] = ((h, 3 * h), "float32")
        shapes[f"{p}.attn.c_attn.bias"] = ((3 * h,), "float32")
        shapes[f"{p}.attn.c_proj.weight"] = ((h, h), "float32")
        shapes[f"{p}.attn.c_proj.bias"] = ((h,), "float32")
        shapes.update(_ln(f"{p}.ln_2", h))
        shapes[f"{p}.mlp.c_fc.weight"] = ((h, 4 * h), "float32")
        shapes[f"{p}.mlp.c_fc.bias"] = ((4 * h,), "float32")
        shapes[f"{p}.mlp.c_proj.weight"] = ((4 * h, h), "float32")
        shapes[f"{p}.mlp.c_proj.bias"] = ((h,), "float32")
    shapes.update(_ln("ln_f", h))
    return shapes


def many_small(count: int = 5000, nbytes: int = 400) -> dict:
    """``count`` float32 tensors of ``nbytes`` each: the latency-bound case."""
    return {f"small.{i:05d}": ((nbytes // 4,), "float32") for i in range(count)}


WORKLOADS = {
    "resnet50": resnet50,
    "bert-base": bert_base,
    "gpt2-small": gpt2_small,
    "many-small": many_small,
}


def workload(name: str) -> dict:
    """The shapes of workload ``name`` (one of :data:`WORKLOADS`)."""
    try:
        return WORKLOADS[name]()
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}") from None


def make_params(shapes: dict, rank: int, library: str = "numpy") -> dict:
    """Arrays of the given shapes whose values depend on ``rank`` (so a sync visibly changes
    them); ``library="torch"``: CPU tensors from torch's allocator, as a ``state_dict``'s are
    (4 KiB pages where numpy gives large arrays huge pages)."""
    out: dict = {}
    for i, (name, (shape, dtype)) in enumerate(shapes.items()):
        array = _np.full(shape, (rank * 1000 + i) % 251, dtype=dtype)
        if library == "torch":
            import torch

            out[name] = torch.from_numpy(array).clone()
        else:
            out[name] = array
    return out
