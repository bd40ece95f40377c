# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The MFU stage: one device's measured training throughput beside SEMU's prediction.

For each workload of :data:`WORKLOADS` the trainer (world size 1, PP = 1, megatron-core's
engine, the local layer specs) trains the calibration's model for :data:`ITERATIONS`
iterations; the first :data:`WARMUP` are not counted (allocator, kernel selection, compiled
fusions). Per iteration:

* **measured**: the step's seconds (``train_step``, the device synchronised at both ends);
* **model FLOPs**: the trainer's own count (``orchestration/model_shape.py``: real tokens only,
  attention per sample or unit, forward plus backward), so **MFU** = FLOPs / seconds / the
  device's datasheet peak (``pipeweaver/semu/hardware.py``: 989.4 TFLOP/s dense bf16 for the
  H200);
* **SEMU**: its prediction of the same microbatches in the same order
  (:class:`~megatron.mllm.prediction.StepPredictor`), once with the calibration stage's file
  and once with SEMU's default efficiencies alone; error = (predicted - measured) / measured.

The medians over the counted iterations are reported, and the peak CUDA memory beside SEMU's.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Callable

import torch

from megatron.mllm.gpu_check.modes import backend_flags, fresh_trainer
from orchestration.calibration import Calibration

WORKLOADS = ("llava15-665k", "obelics-interleaved")
"""Two workload specs of the model's modalities (vision and text): single images of 576
patches, and interleaved documents of 1 to 30 images."""

ITERATIONS = 6
"""Iterations per workload (:data:`WARMUP` of them not counted)."""

WARMUP = 2
"""Leading iterations not counted."""

DRY_RUN_ITERATIONS = 3
"""The dry run's iterations per workload (1 not counted)."""


def _flags(model: str, workload: str, iterations: int) -> list[str]:
    """The trainer's flags: the model config's, the calibration's optimizer flags, ours."""
    from megatron.mllm.calibration.harness import TRAINING_FLAGS
    from megatron.mllm.config_files import find_config, flag_argv

    obj = json.loads(find_config(model).read_text(encoding="utf-8"))
    extra = [f"--{k} {v}" for k, v in TRAINING_FLAGS.items()]
    ours = [f"--workload {workload}", f"--train-iters {iterations}", "--transformer-impl local"]
    return flag_argv([*obj["flags"], *extra, *ours]) + backend_flags()


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure_workload(model: str, workload: str, calibration: Calibration | None,
                     iterations: int, warmup: int) -> dict:  # fmt: skip
    """Train ``model`` on ``workload``; the measured and predicted figures (module docstring)."""
    from megatron.mllm import distributed
    from megatron.mllm.prediction import StepPredictor

    trainer = fresh_trainer(_flags(model, workload, iterations))
    dp = distributed.group_ranks(trainer.pg_collection.dp)
    pp = distributed.group_ranks(trainer.pg_collection.pp)
    semu = {
        "calibrated": StepPredictor(trainer.run, trainer.mllm, 1, calibration, dp, pp)
        if calibration is not None else None,
        "default": StepPredictor(trainer.run, trainer.mllm, 1, None, dp, pp),
    }  # fmt: skip
    peak = semu["default"].cluster.device.peak_flops
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    rows = []
    for i in range(iterations):
        _sync()
        start = time.perf_counter()
        result = trainer.train_step(i)
        _sync()
        seconds = time.perf_counter() - start
        step = trainer.step
        row = {"seconds": seconds, "flops": trainer.metrics(result)["flops"],
               "tokens": trainer.metrics(result)["tokens"], "loss": result.loss}  # fmt: skip
        for name, predictor in semu.items():
            if predictor is not None:
                pred = predictor.predict(step.last_samples, step.last_schedule, step.padded_length)
                row[f"semu_{name}_s"] = pred.step_time_s
                row[f"semu_{name}_peak_memory_bytes"] = max(pred.peak_memory_bytes)
        rows.append(row)
    counted = rows[warmup:]

    def median(key: str) -> float | None:
        values = [r[key] for r in counted if r.get(key) is not None]
        return statistics.median(values) if values else None

    step_s, flops = median("seconds"), median("flops")
    out = {
        "iterations": iterations, "warmup": warmup, "step_s": step_s,
        "step_s_each": [r["seconds"] for r in rows], "model_flops": flops,
        "tokens_per_s": median("tokens") / step_s, "model_tflops_per_s": flops / step_s / 1e12,
        "peak_flops": peak, "mfu": flops / step_s / peak,
        "loss_first_last": [rows[0]["loss"], rows[-1]["loss"]],
        "peak_memory_bytes": int(torch.cuda.max_memory_allocated())
        if torch.cuda.is_available() else None,
    }  # fmt: skip
    for name in semu:
        predicted = median(f"semu_{name}_s")
        out[f"semu_{name}_step_s"] = predicted
        out[f"semu_{name}_error_pct"] = (
            None if predicted is None else (predicted - step_s) / step_s * 100.0
        )
        out[f"semu_{name}_peak_memory_bytes"] = median(f"semu_{name}_peak_memory_bytes")
    del trainer
    return out


def run_throughput(model: str, calibration_path: str | None, dry_run: bool,
                   log: Callable[[str], None], into: dict) -> dict:  # fmt: skip
    """Every workload of :data:`WORKLOADS` (each result lands in ``into`` as it is measured,
    so a stage cut short keeps the finished ones); returns ``into``."""
    calibration = Calibration.load(calibration_path) if calibration_path else None
    into["calibration"] = calibration_path
    into["model"] = model
    iterations, warmup = (DRY_RUN_ITERATIONS, 1) if dry_run else (ITERATIONS, WARMUP)
    workloads = into.setdefault("workloads", {})
    for w in WORKLOADS:
        r = measure_workload(model, w, calibration, iterations, warmup)
        workloads[w] = r
        log(
            f"  {w}: {r['step_s'] * 1e3:.1f} ms/step, {r['model_tflops_per_s']:.2f} TFLOP/s, "
            f"MFU {r['mfu']:.1%}; SEMU {_ms(r['semu_calibrated_step_s'])} "
            f"({_pct(r['semu_calibrated_error_pct'])}), defaults "
            f"{_ms(r['semu_default_step_s'])} ({_pct(r['semu_default_error_pct'])})"
        )
    return into


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"
