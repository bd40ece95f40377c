# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Parameter initialisation that does not depend on the parallel layout.

megatron-core draws initial weights from per-rank RNG streams, so the same model split
differently starts from different weights. OrchWeave initialises every parameter from a seed
derived from its *global* name (module, global layer index, parameter), drawing the full,
unsharded tensor and keeping this rank's tensor-parallel shard. A model cut into any chunks,
on any stages, with any TP size, starts from identical weights, which is what lets a balanced
or dynamically pipelined run learn exactly what the baseline learns.
"""

from __future__ import annotations

import hashlib
import math

import torch

from megatron.core.transformer.transformer_config import TransformerConfig

_OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")


def _seed_of(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_parameter(
    param: torch.Tensor,
    global_name: str,
    seed: int,
    std: float,
    module_layers: int,
    tp_rank: int,
    tp_size: int,
) -> None:
    """Fill one parameter in place.

    Norm weights are 1, biases 0, output projections of attention and MLP are
    ``N(0, std / sqrt(2 * module_layers))`` (megatron-core's scaled init), other weights
    ``N(0, std)``.

    Args:
        param: the (possibly TP-sharded) parameter.
        global_name: layout-independent name, e.g. ``llm.layers.3.mlp.linear_fc1.weight``.
        seed: the model's init seed.
        std: ``--init-method-std``.
        module_layers: layers of the whole module the parameter belongs to.
        tp_rank: this rank's tensor-parallel rank.
        tp_size: tensor-parallel size.
    """
    leaf = global_name.rsplit(".", 1)[-1]
    with torch.no_grad():
        if "bias" in leaf:
            param.zero_()
            return
        if "norm" in global_name and "weight" in leaf:
            param.fill_(1.0)
            return
        sharded = bool(getattr(param, "tensor_model_parallel", False)) and tp_size > 1
        dim = getattr(param, "partition_dim", 0) if sharded else 0
        full_shape = list(param.shape)
        if sharded:
            full_shape[dim] *= tp_size
        scale = std
        if global_name.endswith(_OUTPUT_PROJECTIONS):
            scale = std / math.sqrt(2.0 * max(1, module_layers))
        gen = torch.Generator(device="cpu").manual_seed(_seed_of(seed, global_name))
        full = torch.randn(full_shape, generator=gen, dtype=torch.float32) * scale
        if sharded:
            full = full.narrow(dim, tp_rank * param.shape[dim], param.shape[dim])
        param.copy_(full.to(dtype=param.dtype, device=param.device))


def init_module(
    module: torch.nn.Module,
    global_names: dict[str, str],
    config: TransformerConfig,
    seed: int,
    module_layers: int,
    tp_rank: int,
    tp_size: int,
) -> None:
    """Initialise every parameter of ``module``, named by ``global_names[local_name]``."""
    for local, param in module.named_parameters():
        init_parameter(
            param,
            global_names[local],
            seed,
            config.init_method_std,
            module_layers,
            tp_rank,
            tp_size,
        )
