# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The device itself: its name, matmul FLOP/s and copy bandwidth (SEMU's ``cpu`` entry).

On a GPU the matmul peak is the best of a few large GEMMs and the copy is large enough to
leave the caches (:data:`GPU_GEMM_SIZES`, :data:`GPU_COPY_ELEMENTS`); the CPU's measurement
is unchanged. ``tools/gpu/check.sh`` also reports the sweep itself and SDPA's rate.
"""

from __future__ import annotations

import platform
import time

import torch

from megatron.mllm.calibration.harness import sync

GPU_GEMM_SIZES = (2048, 4096, 8192)
"""Square GEMMs timed on a GPU: a 1024 one is over in microseconds there, launch-bound."""

GPU_COPY_ELEMENTS = 1 << 28
"""Elements copied on a GPU (512 MiB in bf16): far past its caches."""


def _rate(fn, work: float, device: torch.device, reps: int) -> float:
    """``work`` per second of ``fn`` (one warm-up call, then ``reps`` timed calls)."""
    fn()
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return work * reps / (time.perf_counter() - t)


def gemm_sweep(
    device: torch.device, dtype: torch.dtype, sizes=GPU_GEMM_SIZES, reps: int = 10
) -> dict[int, float]:
    """FLOP/s of an ``n x n x n`` matrix multiply, per ``n``."""
    out = {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out[n] = float(_rate(lambda a=a, b=b: a @ b, 2.0 * n**3, device, reps))
    return out


def copy_bandwidth(device: torch.device, dtype: torch.dtype, elements: int, reps: int) -> float:
    """Bytes per second read and written by a device-to-device copy of ``elements``."""
    x = torch.randn(elements, device=device, dtype=dtype)
    y = torch.empty_like(x)
    return float(_rate(lambda: y.copy_(x), 2.0 * x.numel() * x.element_size(), device, reps))


def attention_rate(
    device: torch.device, dtype: torch.dtype, tokens: int, heads: int, dim: int, reps: int = 10
) -> float:
    """FLOP/s of a bidirectional SDPA forward over one sequence (``4 t^2 h d`` FLOPs: scores
    and weighted sum), the kernel the local spec runs per packed sequence."""
    q = torch.randn(1, heads, tokens, dim, device=device, dtype=dtype)
    flops = 4.0 * tokens * tokens * heads * dim
    return float(_rate(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q),
                       flops, device, reps))  # fmt: skip


def measure_hardware(device: torch.device, dtype: torch.dtype, quick: bool) -> dict[str, float]:
    """Matmul FLOP/s (``peak_flops``) and copy bandwidth (``hbm_bandwidth``) of the device."""
    if device.type == "cuda":
        # The best of a few large GEMMs: SEMU's peak is what a layer's big GEMMs can reach.
        peak = max(
            gemm_sweep(device, dtype, GPU_GEMM_SIZES[:1] if quick else GPU_GEMM_SIZES).values()
        )
        bw = copy_bandwidth(device, dtype, GPU_COPY_ELEMENTS >> (4 if quick else 0), 10)
        return {"peak_flops": peak, "hbm_bandwidth": bw}
    n = 256 if quick else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    reps = 3 if quick else 10
    a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    flops = 2 * n**3 * reps / (time.perf_counter() - t)
    x = torch.randn(4_000_000 if quick else 32_000_000, device=device, dtype=dtype)
    y = torch.empty_like(x)
    y.copy_(x)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        y.copy_(x)
    sync(device)
    bw = 2 * x.numel() * x.element_size() * reps / (time.perf_counter() - t)
    return {"peak_flops": float(flops), "hbm_bandwidth": float(bw)}


def device_name(device: torch.device) -> str:
    """``cuda: <GPU>`` or ``cpu: <processor> x <threads> threads``."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"cpu: {name} x {torch.get_num_threads()} threads"
