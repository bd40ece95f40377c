# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Packed-sequence attention without Transformer Engine, against the per-sequence reference.

The reference is the local spec's own attention
(:class:`~megatron.mllm.attention.PackedDotProductAttention`: one SDPA call per sequence). The
one-call kernels of :mod:`megatron.mllm.document_attention` must give its outputs and its
gradients with respect to query, key and value, causal (LLM) and bidirectional (encoders),
with grouped-query attention, over a pack of very different lengths (one token to thousands).

Which kernel runs is decided, and reported, per device: on CUDA ``flex`` compiled
(``torch.compile``), else eager, else ``sdpa-mask``; on CPU torch runs flex forward only, so
the forward is flex and the backward ``sdpa-mask``. Each kernel's time (forward and backward)
is measured beside the reference's on the largest case; no check depends on it.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from megatron.mllm.document_attention import (
    flex_attention_fn,
    flex_packed_attention,
    masked_packed_attention,
)

GPU_CASE = {"lens": [1, 17, 577, 1024, 2304, 4096], "heads": 16, "groups": 4, "dim": 128}
"""The pack on a GPU: a token, a short text, an image of 576 patches plus one, long runs."""

CPU_CASE = {"lens": [1, 7, 64, 33, 129], "heads": 4, "groups": 2, "dim": 16}
"""The dry run's pack."""

TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}
"""Largest difference from the reference, relative to the reference's largest magnitude."""

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _reference(heads: int, groups: int, dim: int, causal: bool):
    """The local spec's attention module for these sizes."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.mllm.attention import PackedDotProductAttention

    config = TransformerConfig(
        num_layers=1, hidden_size=heads * dim, num_attention_heads=heads,
        num_query_groups=groups, kv_channels=dim, attention_dropout=0.0,
    )  # fmt: skip
    mask = AttnMaskType.causal if causal else AttnMaskType.no_mask
    return PackedDotProductAttention(config, 1, mask, "self")


def _passes(fn: Callable, inputs, grad) -> tuple[torch.Tensor, tuple]:
    """Output and input gradients of ``fn`` (None gradients: forward only)."""
    q, k, v = (x.detach().requires_grad_(grad is not None) for x in inputs)
    out = fn(q, k, v)
    if grad is None:
        return out.detach(), ()
    return out.detach(), torch.autograd.grad(out, (q, k, v), grad)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def choose_kernels(device: torch.device) -> dict[str, str]:
    """The kernel of the forward and of the backward on ``device`` (see the module docstring)."""
    if device.type == "cuda":
        return {"forward": "flex", "backward": "flex"}
    return {"forward": "flex", "backward": "sdpa-mask"}


def check_case(device: torch.device, dtype: str, causal: bool, case: dict,
               compiled: Callable | None) -> dict:  # fmt: skip
    """One pack, one precision, one direction: each kernel's largest relative errors."""
    from megatron.mllm.batch import thd_params

    gen = torch.Generator(device="cpu").manual_seed(7)
    t, h, g, d = sum(case["lens"]), case["heads"], case["groups"], case["dim"]

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=DTYPES[dtype])

    inputs = (draw(t, h, d), draw(t, g, d), draw(t, g, d))
    grad = draw(t, h * d)
    psp = thd_params(case["lens"], device)
    cu = psp.cu_seqlens_q
    module = _reference(h, g, d, causal)
    ref_out, ref_grads = _passes(lambda q, k, v: module(q, k, v, None, packed_seq_params=psp),
                                 inputs, grad)  # fmt: skip
    kernels = {
        "flex": lambda q, k, v: flex_packed_attention(q, k, v, cu, causal, attention=compiled),
        "sdpa-mask": lambda q, k, v: masked_packed_attention(q, k, v, cu, causal),
    }
    chosen = choose_kernels(device)
    out = {"dtype": dtype, "causal": causal, "tokens": t, "kernels": chosen}
    fwd, _ = _passes(kernels[chosen["forward"]], inputs, None)
    out["forward_error"] = _error(fwd, ref_out)
    _, grads = _passes(kernels[chosen["backward"]], inputs, grad)
    out["backward_error"] = max(_error(a, b) for a, b in zip(grads, ref_grads))
    out["tolerance"] = TOLERANCE[dtype]
    out["within_tolerance"] = max(out["forward_error"], out["backward_error"]) <= out["tolerance"]
    return out


def time_kernels(device: torch.device, case: dict, compiled: Callable | None,
                 reps: int = 5) -> dict[str, float]:  # fmt: skip
    """Median milliseconds of forward plus backward (bf16 on CUDA, fp32 on CPU, causal) of the
    reference and of each kernel that runs both passes on ``device``."""
    from megatron.mllm.batch import thd_params

    dtype = "bf16" if device.type == "cuda" else "fp32"
    t, h, g, d = sum(case["lens"]), case["heads"], case["groups"], case["dim"]
    x = [torch.randn(t, n, d, device=device, dtype=DTYPES[dtype]) for n in (h, g, g)]
    grad = torch.randn(t, h * d, device=device, dtype=DTYPES[dtype])
    psp = thd_params(case["lens"], device)
    module = _reference(h, g, d, True)
    fns = {
        "per-sequence": lambda q, k, v: module(q, k, v, None, packed_seq_params=psp),
        "sdpa-mask": lambda q, k, v: masked_packed_attention(q, k, v, psp.cu_seqlens_q, True),
    }
    if device.type == "cuda":
        fns["flex"] = lambda q, k, v: flex_packed_attention(
            q, k, v, psp.cu_seqlens_q, True, attention=compiled
        )
    out = {}
    for name, fn in fns.items():
        samples = []
        for _ in range(reps + 1):  # the first is a warm-up
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            _passes(fn, x, grad)
            if device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
        out[name] = statistics.median(samples[1:]) * 1e3
    return out


class FlexFunction:
    """torch's ``flex_attention`` as it runs on a device: compiled on CUDA, falling back to
    eager (and saying so in :attr:`how`) when compiling fails there; eager on CPU."""

    def __init__(self, device: torch.device):
        self.compiled = flex_attention_fn(True) if device.type == "cuda" else None
        self.eager = flex_attention_fn(False)
        self.how = "compiled" if self.compiled is not None else "eager (no compiled flex on CPU)"

    def __call__(self, *args, **kwargs):
        if self.compiled is not None:
            try:
                return self.compiled(*args, **kwargs)
            except Exception as e:  # a torch or triton that cannot compile here: run eager
                self.compiled = None
                self.how = f"eager (torch.compile failed: {type(e).__name__}: {str(e)[:120]})"
        # Eager flex traces itself with dynamo, which the CPU shim switches off for
        # megatron-core's fusions: on for this call only.
        with torch._dynamo.config.patch(disable=False):
            return self.eager(*args, **kwargs)
