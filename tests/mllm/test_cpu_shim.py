# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The CPU shim's replacements compute what megatron-core's originals compute."""

from __future__ import annotations

import pytest
import torch

from megatron.mllm import cpu_shim

pytestmark = pytest.mark.skipif(cpu_shim.cuda_available(), reason="the shim is off with CUDA")


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_bias_gelu_matches_megatron_core_forward_and_backward(dtype, tol):
    """megatron-core's MLP calls ``bias_gelu_impl``: its forward and both gradients equal
    megatron-core's own ``bias_gelu``/``bias_gelu_back`` in float32, within ``tol`` of the
    largest value (bfloat16 inputs against the float32 originals: one bfloat16 rounding)."""
    cpu_shim.apply()
    from megatron.core.fusions import fused_bias_gelu
    from megatron.core.transformer.mlp import bias_gelu_impl

    assert fused_bias_gelu.bias_gelu is cpu_shim._bias_gelu_one_kernel
    own_gelu, own_gelu_back = cpu_shim.megatron_bias_gelu
    gen = torch.Generator().manual_seed(0)
    # Inputs across GeLU's range: both tails and the bend near zero.
    y = torch.randn(257, 96, generator=gen) * 3
    bias = torch.randn(96, generator=gen)
    g = torch.randn(257, 96, generator=gen)
    got_in = y.to(dtype).requires_grad_()
    got_bias = bias.to(dtype).requires_grad_()
    got = bias_gelu_impl(got_in, got_bias)
    got.backward(g.to(dtype))
    y, bias, g = (t.to(dtype).float() for t in (y, bias, g))  # the same inputs, in float32
    want = own_gelu(bias, y)
    want_in = own_gelu_back(g, bias, y)
    want_bias = want_in.sum(0)
    for name, a, b in (("output", got, want), ("input's gradient", got_in.grad, want_in),
                       ("bias's gradient", got_bias.grad, want_bias)):  # fmt: skip
        err = (a.float() - b).abs().max() / b.abs().max()
        assert err <= tol, f"{name}: {err:.2e} of the largest value"
