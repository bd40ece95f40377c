# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Lets megatron-core 0.19.2 run on a machine without CUDA (CPU tensors, gloo collectives).

megatron-core hard-codes CUDA in a handful of places that a CPU run reaches: ``device="cuda"``
literals (the pipeline schedules' token counter, the optimizer, grad-norm helpers),
``torch.cuda.current_device()`` for buffers, ``torch.cuda.current_stream()`` in the DDP grad
buffers, ``torch.cuda.synchronize()`` after batched P2P, the CUDA RNG tracker and the CUDA RNG
state that activation recompute (``--recompute-granularity``) saves and restores, an assertion
that gradients are CUDA tensors when they are clipped, the GPU architecture that Megatron's
argument validation reads for TP > 1, and the ``Tensor.type()`` names (``torch.cuda.FloatTensor``)
by which the distributed optimizer sorts the parameters it shards.

It also stands in for torch.compile, which it switches off (compiling costs each CPU process tens
of seconds): megatron-core's bias-GeLU, one compiled kernel on a GPU, runs as ATen's one tanh-GeLU
kernel instead of its ~15 uncompiled elementwise ops.

Everything here is applied by :func:`apply` only when CUDA is absent; on a GPU machine it is a
no-op, so the same code path runs with NCCL. OrchWeave's own code never needs it: it allocates
on the device of the tensors it already holds.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import types

import torch

logger = logging.getLogger(__name__)

_applied = False

megatron_bias_gelu: tuple | None = None
"""megatron-core's own ``(bias_gelu, bias_gelu_back)``, which :func:`apply` replaces (the
tests' oracle)."""


_FACTORIES = (
    "tensor", "as_tensor", "scalar_tensor", "zeros", "ones", "empty", "full", "empty_strided",
    "arange", "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "tril_indices", "triu_indices",
)  # fmt: skip
"""The ``torch`` functions that take a ``device``: megatron-core passes ``device="cuda"`` (or
``torch.device("cuda")``) to some of them in the paths a CPU run reaches (the schedules' token
counter, the optimizer's grad-norm helpers)."""


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def _on_cpu(factory):
    """``factory`` with a CUDA ``device`` argument redirected to the CPU.

    A wrapper per factory instead of a ``TorchFunctionMode`` entered for the whole run: a mode
    runs Python on every torch call (about 1.3 us each on the 2-core host, 8,600 to 10,500
    calls per iteration of the CPU main job), these only on the few allocations.
    """

    @functools.wraps(factory)
    def on_cpu(*args, **kwargs):
        device = kwargs.get("device")
        if device is not None and _is_cuda(device):
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return on_cpu


def _tensor_cuda_on_cpu(self, *args, **kwargs):
    """Stands in for ``Tensor.cuda()``: the tensor itself, as on a GPU a tensor already there."""
    return self


class _CudaTypeNamesMode(torch.overrides.TorchFunctionMode):
    """Answers ``Tensor.type()`` for a CPU tensor with its CUDA name (``torch.cuda.FloatTensor``).

    megatron-core's distributed optimizer sorts the parameters it shards by these names and
    rejects any other; entered only around its constructor, so nothing else sees the names.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            if isinstance(result, str) and not result.startswith("torch.cuda."):
                result = "torch.cuda." + result[len("torch.") :]
        return result


def _with_cuda_type_names(function):
    """``function`` run inside :class:`_CudaTypeNamesMode`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with _CudaTypeNamesMode():
            return function(*args, **kwargs)

    return wrapper


class _CpuDeviceProperties:
    """Stands in for ``torch.cuda.get_device_properties()``: no CUDA architecture at all."""

    name = "cpu"
    major = 0
    minor = 0
    total_memory = 0
    multi_processor_count = 0


class _NullStream:
    """Stands in for ``torch.cuda.current_stream()`` and a new ``torch.cuda.Stream``: CPU ops
    are already ordered."""

    def wait_event(self, *args, **kwargs):
        return None

    def wait_stream(self, *args, **kwargs):
        return None

    def synchronize(self):
        return None

    def record_event(self, *args, **kwargs):
        return None


def cuda_available() -> bool:
    """Whether a CUDA device can be used."""
    return torch.cuda.is_available()


def _stub_triton_kernels() -> None:
    # megatron.core imports a triton kernel module unguarded; CPU torch wheels ship no triton.
    try:
        import triton  # noqa: F401
    except ImportError:
        stub = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
        stub.GLOBAL_BLOCK_SIZE = 1024
        stub.paged_stash_copy_kernel = None
        stub.paged_stash_pop_kernel = None
        sys.modules[stub.__name__] = stub


def _clip_grad_by_total_norm_cpu(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """megatron-core's clip, minus its assertion that gradients are CUDA tensors."""
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    coeff = max_norm / (total_norm + 1.0e-6)
    if isinstance(coeff, torch.Tensor):
        coeff = coeff.clamp_max(1.0)
    elif coeff >= 1.0:
        return
    for g in grads:
        g.detach().mul_(coeff)


def _bias_gelu_one_kernel(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """megatron-core's ``bias_gelu`` (tanh-approximated GeLU of ``bias + y``) as ATen's one
    kernel, as torch.compile fuses it on a GPU."""
    return torch.nn.functional.gelu(bias + y, approximate="tanh")


def _bias_gelu_back_one_kernel(g: torch.Tensor, bias: torch.Tensor, y: torch.Tensor):
    """megatron-core's ``bias_gelu_back`` (the tanh approximation's derivative times ``g``) as
    ATen's one kernel."""
    return torch.ops.aten.gelu_backward(g, bias + y, approximate="tanh")


def _no_cuda_rng_state(*args, **kwargs) -> torch.Tensor:
    """Stands in for megatron-core's ``_get_cuda_rng_state``: there is no CUDA generator (the
    CPU generator's state is saved beside it by the same caller)."""
    return torch.empty(0, dtype=torch.uint8)


def apply() -> bool:
    """Install the CPU compatibility patches when CUDA is absent.

    Call it before importing ``megatron.core``. Safe to call more than once.

    Returns:
        bool: True when the patches are (or already were) in place, False on a CUDA machine.
    """
    global _applied
    if cuda_available():
        return False
    if _applied:
        return True
    _stub_triton_kernels()
    # megatron-core wraps its fused kernels (bias-gelu, bias-dropout-add, ...) in torch.compile;
    # on CPU every process would spend tens of seconds compiling C++ for a few elementwise ops.
    torch._dynamo.config.disable = True
    # Uncompiled, megatron-core's bias-GeLU runs as about 15 elementwise ops, each allocating a
    # tensor of the MLP's full width: 2-10x the time of ATen's tanh-GeLU kernels here (1,000 to
    # 32,000 rows of 256), the more the larger the tensor (the per-phase step runs each encoder
    # once on all its units).
    # A GPU runs it as one compiled kernel; ATen's is the same function in one pass.
    from megatron.core.fusions import fused_bias_gelu

    global megatron_bias_gelu
    megatron_bias_gelu = (fused_bias_gelu.bias_gelu, fused_bias_gelu.bias_gelu_back)
    fused_bias_gelu.bias_gelu = _bias_gelu_one_kernel
    fused_bias_gelu.bias_gelu_back = _bias_gelu_back_one_kernel
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_stream = lambda *args, **kwargs: _NullStream()
    # DDP's side stream for the all-reduce across --num-distributed-optimizer-instances.
    torch.cuda.Stream = lambda *args, **kwargs: _NullStream()
    torch.cuda.get_device_properties = lambda *args, **kwargs: _CpuDeviceProperties()
    # Megatron's argument validation demands this for TP > 1 before Blackwell; without CUDA it
    # limits nothing.
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    # The CUDA literals sit deep inside megatron-core calls (schedules, optimizer) that we do
    # not wrap one by one: the factories they call take the CPU instead.
    for name in _FACTORIES:
        setattr(torch, name, _on_cpu(getattr(torch, name)))
    torch.Tensor.cuda = _tensor_cuda_on_cpu
    from megatron.core.optimizer import optimizer as mcore_optimizer

    mcore_optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_cpu
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    DistributedOptimizer.__init__ = _with_cuda_type_names(DistributedOptimizer.__init__)
    # Megatron's recompute (CheckpointFunction) saves the CUDA RNG state with the CPU's and
    # restores both before it reruns a forward; without CUDA only the CPU's exists.
    from megatron.core.tensor_parallel import random as mcore_random

    mcore_random._get_cuda_rng_state = _no_cuda_rng_state
    mcore_random._set_cuda_rng_state = lambda *args, **kwargs: None
    _applied = True
    logger.debug("megatron-core CPU compatibility shim applied")
    return True


def model_parallel_manual_seed(seed: int) -> None:
    """Seed megatron-core's model-parallel RNG tracker.

    On CPU there is no CUDA RNG state to fork, so megatron-core's inference tracker (whose
    ``add``/``fork`` are no-ops) is used; dropout then draws from the CPU generator.
    """
    from megatron.core import tensor_parallel

    if cuda_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)
