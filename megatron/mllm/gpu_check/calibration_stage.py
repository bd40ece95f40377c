# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The calibration stage: the repository's calibration, run on this device for a real model.

:func:`~megatron.mllm.calibration.calibrate` measures the trainer's own chunks over a grid of
packed shapes, megatron-core's optimizer and the host's batch building, and writes the file
that SEMU and the balancer read (``calibration-<device>.json``). On a GPU the model is
:data:`GPU_MODEL` (a ViT-H-class encoder and a 1.5B Llama-3.2-1B-shaped LLM in bf16) over
:data:`GPU_GRID`; the dry run calibrates :data:`DRY_RUN_MODEL` on the quick grid.

Beside the file, the device's own rates, each as a fraction of its datasheet peak
(``pipeweaver/semu/hardware.py``) next to the efficiency SEMU assumes by default: large GEMMs
(``compute``), SDPA (``attention``) and a device-to-device copy (``memory``), and the layers'
own FLOP rate as the calibration measured it (``layers``).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch

from megatron.mllm.calibration import calibrate
from megatron.mllm.calibration.hardware import (
    GPU_GEMM_SIZES,
    attention_rate,
    copy_bandwidth,
    gemm_sweep,
)
from megatron.mllm.prediction import run_cluster
from pipeweaver.semu.hardware import Efficiency

GPU_MODEL = "gpu-check"
"""The model calibrated on a GPU (``scripts/configs/gpu-check.json``)."""

DRY_RUN_MODEL = "gpu-check-tiny"
"""The dry run's model: the same structure, tiny (``scripts/configs/gpu-check-tiny.json``)."""

GPU_GRID = {"lengths": (512, 1024, 2048, 4096), "packs": (1, 2, 4), "max_tokens": 8192,
            "reps": 3}  # fmt: skip
"""Sequence lengths, sequences per call, tokens per call at most, timed repetitions: images of
576 to 4096 patches and LLM samples of 512 to 8192 tokens, every point well past launch
overheads."""

STAGES = ("layers", "optimizer", "host")
"""The calibration's in-process stages (the ``parallel`` one needs a second device, the
``trainer`` one would train on the MFU stage's workload)."""


def device_key() -> str:
    """SEMU's name of this device (``h200``; ``cpu`` without CUDA)."""
    return run_cluster(1, 1).device.name


def calibration_name() -> str:
    """The calibration file's name for this device: ``calibration-h200.json``."""
    return f"calibration-{device_key()}.json"


def _rates(device: torch.device, dtype: torch.dtype, dry_run: bool) -> dict:
    """GEMM sweep, copy bandwidth and SDPA's rate on ``device``."""
    if dry_run:
        gemm = gemm_sweep(device, dtype, (128, 256), reps=2)
        copy = copy_bandwidth(device, dtype, 1 << 20, reps=2)
        attention = attention_rate(device, dtype, 256, 4, 32, reps=2)
    else:
        gemm = gemm_sweep(device, dtype, GPU_GEMM_SIZES)
        copy = copy_bandwidth(device, dtype, 1 << 28, reps=10)
        attention = attention_rate(device, dtype, 4096, 16, 128)
    return {"gemm_flops": {str(n): v for n, v in gemm.items()}, "copy_bytes_per_s": copy,
            "attention_flops": attention}  # fmt: skip


def run_calibration(out_dir: str | os.PathLike, dry_run: bool,
                    log: Callable[[str], None]) -> dict:  # fmt: skip
    """Calibrate, write the file into ``out_dir``; returns the stage's JSON section."""
    model = DRY_RUN_MODEL if dry_run else GPU_MODEL
    if dry_run:
        options = {"quick": True}
    else:
        options = {**GPU_GRID, "threads": min(8, os.cpu_count() or 1)}
    cal = calibrate(model, stages=STAGES, log=log, **options)
    name = calibration_name()
    cal.save(Path(out_dir) / name)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rates = _rates(device, dtype, dry_run)
    spec = run_cluster(1, 1).device
    peak, bw = spec.peak_flops, spec.hbm_bandwidth
    layers = cal.efficiency.get("compute", 0.0) * cal.hardware.get("peak_flops", 0.0)
    measured = {
        "compute": max(rates["gemm_flops"].values()) / peak,
        "attention": rates["attention_flops"] / peak,
        "memory": rates["copy_bytes_per_s"] / bw,
        "layers": layers / peak,
    }
    return {
        "file": name,
        "model": model,
        "device": cal.device,
        "source": cal.source,
        "datasheet": {"device": spec.name, "peak_flops": peak, "hbm_bandwidth": bw},
        "hardware": dict(cal.hardware),
        "rates": rates,
        "efficiency_measured": measured,
        "efficiency_semu_default": asdict(Efficiency()),
        "modules": {m: _layer_summary(t, cal.model.get(m, {})) for m, t in cal.modules.items()},
    }


def _layer_summary(table, sizes: dict) -> dict:
    """One module's fitted layer, forward and backward over one 1024-token sequence."""
    return {
        "forward_us_per_1k_tokens": table.forward_packed_s([1024]) * 1e6,
        "backward_us_per_1k_tokens": table.backward_packed_s([1024]) * 1e6,
        "layers": sizes.get("num_layers"),
    }
