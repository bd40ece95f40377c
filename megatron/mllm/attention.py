# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Core attention over packed (THD) sequences for the local (non Transformer Engine) spec.

megatron-core's local ``DotProductAttention`` rejects ``packed_seq_params``, and a block-diagonal
mask would cost O(total_tokens^2) however short the packed sequences are. This module computes
attention segment by segment, so its cost is the sum of per-sequence costs, like the varlen
kernels of Transformer Engine on GPUs. That keeps CPU runs honest about what packing and
balancing buy.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


class PackedDotProductAttention(MegatronModule):
    """Softmax attention within each packed sequence, causal or bidirectional.

    Takes the THD layout that megatron-core's ``Attention`` produces when it is given
    ``PackedSeqParams(qkv_format="thd")``: query ``[t, np, hn]``, key/value ``[t, ng, hn]``.
    Returns ``[t, np * hn]``.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection=None,
    ):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("PackedDotProductAttention does not support context parallelism")
        tp_size = pg_collection.tp.size() if pg_collection is not None else 1
        self.attn_mask_type = attn_mask_type
        self.num_heads = divide(config.num_attention_heads, tp_size)
        self.num_groups = divide(config.num_query_groups or config.num_attention_heads, tp_size)
        self.head_dim = config.kv_channels
        self.softmax_scale = (
            softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        )
        self.dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        """Attention of every packed sequence with itself."""
        if packed_seq_params is None or packed_seq_params.qkv_format != "thd":
            raise ValueError("PackedDotProductAttention needs PackedSeqParams(qkv_format='thd')")
        if attention_bias is not None:
            raise ValueError("PackedDotProductAttention does not support an attention bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal)
        # [t, n, d] -> [n, t, d]: SDPA attends over the second to last dim.
        q = query.transpose(0, 1)
        k = key.transpose(0, 1)
        v = value.transpose(0, 1)
        if self.num_heads != self.num_groups:
            k = k.repeat_interleave(self.num_heads // self.num_groups, dim=0)
            v = v.repeat_interleave(self.num_heads // self.num_groups, dim=0)
        bounds = packed_seq_params.cu_seqlens_q.tolist()
        dropout = self.dropout_p if self.training else 0.0
        outs = [
            F.scaled_dot_product_attention(
                q[:, a:b],
                k[:, a:b],
                v[:, a:b],
                dropout_p=dropout,
                is_causal=causal,
                scale=self.softmax_scale,
            )
            for a, b in zip(bounds[:-1], bounds[1:])
            if b > a
        ]
        out = torch.cat(outs, dim=1) if len(outs) != 1 else outs[0]
        if out.shape[1] != query.shape[0]:
            raise ValueError(
                f"packed sequence lengths sum to {bounds[-1]} but the input has "
                f"{query.shape[0]} tokens"
            )
        return out.transpose(0, 1).reshape(query.shape[0], -1)
