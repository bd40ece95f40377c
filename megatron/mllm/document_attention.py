# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Attention over packed (THD) sequences in one kernel call, without Transformer Engine.

:class:`~megatron.mllm.attention.PackedDotProductAttention` (the local spec's attention) runs
one SDPA call per packed sequence: exact, and as cheap as the sum of the sequences, but a
Python loop with a host synchronisation (``cu_seqlens.tolist()``) per layer. On a GPU without
Transformer Engine's varlen kernel, torch offers two one-call forms of the same computation:

* ``flex``: ``torch.nn.attention.flex_attention`` with a *document* block mask (a query sees
  only keys of its own sequence, and with causal attention none after itself). The block mask
  skips every tile that lies outside all sequences, so the cost stays close to the sum of
  per-sequence costs; compiled (``torch.compile``) it is a fused Triton kernel. torch runs it
  on CPU forward only (no backward);
* ``sdpa-mask``: one ``scaled_dot_product_attention`` over the whole pack with a dense
  block-diagonal boolean mask: O(total tokens^2) time and memory, the fallback wherever flex
  cannot run.

Both take and return the local spec's THD layout (query ``[t, heads, dim]``, key and value
``[t, groups, dim]``); ``tools/gpu/check.sh`` compares them with the per-sequence reference.
Neither is wired into the layer specs yet.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

KERNELS = ("flex", "sdpa-mask")
"""The one-call kernels, in order of preference."""


def document_ids(cu_seqlens: Tensor, total: int) -> Tensor:
    """The packed sequence each of ``total`` tokens belongs to (``[total]``, int32, on
    ``cu_seqlens``' device)."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    ids = torch.arange(lens.numel(), device=cu_seqlens.device, dtype=torch.int32)
    out = torch.repeat_interleave(ids, lens)
    if out.numel() != total:
        raise ValueError(
            f"packed sequence lengths sum to {out.numel()} but the input has {total} tokens"
        )
    return out


def _heads_first(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    # THD [t, n, d] -> [1, n, t, d]: both kernels attend over the second to last dimension.
    return tuple(x.transpose(0, 1).unsqueeze(0) for x in (query, key, value))


def flex_attention_fn(compiled: bool) -> Callable:
    """torch's ``flex_attention``, compiled into its fused kernel when ``compiled``."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False) if compiled else flex_attention


def flex_packed_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens: Tensor,
    causal: bool,
    scale: float | None = None,
    attention: Callable | None = None,
) -> Tensor:
    """Attention within each packed sequence, one ``flex_attention`` call.

    Args:
        query: ``[t, heads, dim]``.
        key: ``[t, groups, dim]`` (``heads`` a multiple of ``groups``).
        value: ``[t, groups, dim]``.
        cu_seqlens: ``[sequences + 1]`` offsets of the packed sequences, on the inputs' device.
        causal: causal attention within each sequence (LLM) or bidirectional (encoders).
        scale: softmax scale; None: ``1 / sqrt(dim)``.
        attention: the flex function (:func:`flex_attention_fn`); None: eager.

    Returns:
        ``[t, heads * dim]``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    t = query.shape[0]
    doc = document_ids(cu_seqlens, t)

    def same_document(b, h, q_idx, kv_idx):
        keep = doc[q_idx] == doc[kv_idx]
        return keep & (kv_idx <= q_idx) if causal else keep

    mask = create_block_mask(same_document, None, None, t, t, device=query.device)
    q, k, v = _heads_first(query, key, value)
    fn = attention or flex_attention_fn(False)
    out = fn(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.squeeze(0).transpose(0, 1).reshape(t, -1)


def masked_packed_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens: Tensor,
    causal: bool,
    scale: float | None = None,
) -> Tensor:
    """Attention within each packed sequence, one SDPA call with a dense block-diagonal mask
    (same arguments and result as :func:`flex_packed_attention`)."""
    t = query.shape[0]
    doc = document_ids(cu_seqlens, t)
    allowed = doc.view(-1, 1) == doc.view(1, -1)
    if causal:
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=query.device).tril()
    q, k, v = _heads_first(query, key, value)
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)
    return out.squeeze(0).transpose(0, 1).reshape(t, -1)
