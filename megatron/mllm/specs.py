# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""megatron-core layer specs for OrchWeave's modules.

Every module runs on packed (THD) sequences: the LLM with causal attention within each sample,
the encoders with bidirectional attention within each unit. With Transformer Engine the
attention is TE's varlen kernel; with the local spec it is :class:`PackedDotProductAttention`.
"""

from __future__ import annotations

import copy

from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.mllm.attention import PackedDotProductAttention


def transformer_layer_spec(
    use_te: bool, causal: bool, normalization: str = "LayerNorm"
) -> ModuleSpec:
    """The spec of one transformer layer.

    Args:
        use_te: Transformer Engine modules (GPU) instead of megatron-core's local ones.
        causal: causal attention (LLM) or bidirectional (encoders).
        normalization: "LayerNorm" or "RMSNorm", as Megatron's ``--normalization``.
    """
    if use_te:
        spec = get_gpt_layer_with_transformer_engine_spec()
    else:
        spec = copy.deepcopy(get_gpt_layer_local_spec(normalization=normalization))
        spec.submodules.self_attention.submodules.core_attention = PackedDotProductAttention
    attention = spec.submodules.self_attention
    attention.params = {
        **attention.params,
        "attn_mask_type": AttnMaskType.causal if causal else AttnMaskType.no_mask,
    }
    return spec


def projector_submodules(use_te: bool) -> MLPSubmodules:
    """MLP submodules of megatron-core's MultimodalProjector (no fused layernorm)."""
    if use_te:
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TERowParallelLinear,
        )

        return MLPSubmodules(linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear)
    return MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
