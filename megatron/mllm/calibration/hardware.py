# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The device itself: its name, matmul FLOP/s and copy bandwidth (SEMU's ``cpu`` entry)."""

from __future__ import annotations

import platform
import time

import torch

from megatron.mllm.calibration.harness import sync


def measure_hardware(device: torch.device, dtype: torch.dtype, quick: bool) -> dict[str, float]:
    """Matmul FLOP/s (``peak_flops``) and copy bandwidth (``hbm_bandwidth``) of the device."""
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
