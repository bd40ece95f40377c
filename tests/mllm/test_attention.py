# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Packed attention equals attention computed on each sequence alone."""

from __future__ import annotations

import math

import pytest
import torch

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.mllm.attention import PackedDotProductAttention


def _dense(q, k, v, causal):
    # q [s, n, d]; plain softmax attention of one sequence
    scores = torch.einsum("snd,tnd->nst", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[0]
        scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), -math.inf)
    return torch.einsum("nst,tnd->snd", scores.softmax(-1), v)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("groups", [4, 2])
def test_packed_attention_matches_each_sequence_alone(causal, groups):
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=groups,
        attention_dropout=0.0,
    )  # fmt: skip
    mask = AttnMaskType.causal if causal else AttnMaskType.no_mask
    attn = PackedDotProductAttention(config, 1, mask, "self")
    lens = [5, 1, 9, 3]
    t = sum(lens)
    q = torch.randn(t, 4, 8)
    k = torch.randn(t, groups, 8)
    v = torch.randn(t, groups, 8)
    cu = torch.tensor([0, 5, 6, 15, 18], dtype=torch.int32)
    out = attn(q, k, v, None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu))
    assert out.shape == (t, 32)
    rep = 4 // groups
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        ref = _dense(
            q[sl], k[sl].repeat_interleave(rep, 1), v[sl].repeat_interleave(rep, 1), causal
        ).reshape(n, 32)
        torch.testing.assert_close(out[sl], ref, rtol=1e-5, atol=1e-6)
        start += n


def test_packed_attention_needs_thd_params():
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2)
    attn = PackedDotProductAttention(config, 1, AttnMaskType.causal, "self")
    x = torch.randn(3, 2, 4)
    with pytest.raises(ValueError, match="qkv_format='thd'"):
        attn(x, x, x, None)
