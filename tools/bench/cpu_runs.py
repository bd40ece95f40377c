# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Shared by the CPU benchmarks: run the main job with overrides, summarise its metrics.

Runs happen one after another on the same machine, on the same data (same workload, seed and
global batches), so their ratios compare like with like; the first iterations are warm-up.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from megatron.mllm.cli.launch import MAIN_JOB, REPO, free_port

DEMO_FLAGS = [
    "--tokenizer-type", "HuggingFaceTokenizer", "--vocab-size", "384", "--image-tile-size", "32",
    "--vision-patch-size", "8", "--image-max-tiles", "4",
]  # fmt: skip
"""The README's demo command, but for ``--data-path`` and ``--tokenizer-model``."""


def add_demo_data_argument(parser) -> None:
    """``--data-path``, defaulting to the demo blend, for the benchmarks on real data."""
    parser.add_argument(
        "--data-path",
        default="demo-data/blend.yaml",
        help="default demo-data/blend.yaml (the demo, built if absent)",
    )


def demo_data_flags(path: str) -> tuple[list[str], tempfile.TemporaryDirectory | None]:
    """The demo's trainer flags on ``path`` (a dataset directory or a metadataset YAML whose
    directory holds ``tokenizer/``); when ``path`` does not exist, on a demo dataset built in a
    temporary directory (its blend), returned for the caller to clean up."""
    from megatron.mllm.demo_data import DemoSpec, build_demo_dataset

    scratch = None
    root = os.path.dirname(path) if path.endswith(".yaml") else path
    if not os.path.exists(path):
        scratch = tempfile.TemporaryDirectory()
        root = os.path.join(scratch.name, "demo-data")
        with contextlib.redirect_stdout(io.StringIO()):  # Energon's preparator prints progress
            build_demo_dataset(root, DemoSpec())
        path = os.path.join(root, "blend.yaml")
        print(f"no dataset at the given path: built the demo dataset in {root}")
    flags = [*DEMO_FLAGS, "--data-path", path, "--tokenizer-model", os.path.join(root, "tokenizer")]
    return flags, scratch


def run_main_job(name: str, flags: list[str], iters: int, nproc: int = 2,
                 log_interval: int | None = None) -> list[dict]:  # fmt: skip
    """Run ``scripts/pretrain_mllm_cpu.sh`` with ``flags``; return per-iteration metrics.

    ``log_interval`` defaults to ``iters`` (one log line per run)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        env = dict(
            os.environ, PYTHON=sys.executable, NPROC=str(nproc), MASTER_PORT=str(free_port())
        )
        env.setdefault("PYTHONWARNINGS", "ignore")
        cmd = ["bash", str(MAIN_JOB), *flags,
               "--train-iters", str(iters), "--log-interval", str(log_interval or iters),
               "--metrics-jsonl", str(metrics)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0:
            # A rank's own error comes first; torchrun's summary of the others fills the tail.
            causes = [line for line in (proc.stdout + proc.stderr).splitlines()
                      if line.startswith("error:")][:10]  # fmt: skip
            # torchrun's own traceback only when no rank said why.
            detail = "\n".join(dict.fromkeys(causes)) if causes else proc.stderr[-2000:]
            sys.exit(f"error: the {name} run failed:\n{detail}")
        return [json.loads(line) for line in metrics.read_text().splitlines()]


def refresh_layers(calibration: str, workdir: str, model: str = "cpu-main") -> str:
    """``calibration`` with its layer tables re-measured on this host now (``tools/calibrate.py
    --stages layers --base``, about a minute); the path of the refreshed file in ``workdir``.

    Why: this shared host's speed drifts by 10-30% within minutes to hours, and the probe that
    rescales a calibration (``orchestration.host_probe``) applies one factor to every time. A
    benchmark whose SEMU ratios weigh compute against host work scores them with layer tables of
    the host as it runs, and keeps the runtime's and transfers' figures of the file."""
    out = str(Path(workdir) / "calibration-refreshed.json")
    cmd = [sys.executable, str(REPO / "tools" / "calibrate.py"), "--model", model,
           "--stages", "layers", "--base", calibration, "--output", out, "--no-progress"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))  # fmt: skip
    if proc.returncode != 0:
        causes = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        sys.exit(causes[0] if causes else f"error: refreshing {calibration}: {proc.stderr[-2000:]}")
    return out


def split_trainer_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """A benchmark's own arguments and the trainer flags after ``--`` (passed to every run)."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def median_iteration_ms(records: list[dict], warmup: int) -> float:
    """Median iteration time of the timed iterations (after ``warmup``), in ms."""
    return 1000 * statistics.median(r["iteration_time_s"] for r in records[warmup:])


def predicted_step_ms(records: list[dict], warmup: int) -> float | None:
    """SEMU's median predicted step of the timed iterations (``--step-prediction``), in ms;
    None when no iteration has one."""
    steps = [r["prediction"]["step_s"] for r in records[warmup:] if r.get("prediction")]
    steps = [s for s in steps if s]
    return 1000 * statistics.median(steps) if steps else None


def summarize(records: list[dict], warmup: int, nproc: int = 2) -> dict:
    """Median iteration time and throughputs over the timed iterations."""
    timed = records[warmup:]
    total = sum(r["iteration_time_s"] for r in timed)
    out = {
        "iteration_ms": 1000 * statistics.median(r["iteration_time_s"] for r in timed),
        "samples_per_s": sum(r["samples"] for r in timed) / total,
        "tokens_per_s": sum(r["tokens"] for r in timed) / total,
        "tflops_per_rank": sum(r["flops"] for r in timed) / total / nproc / 1e12,
        "final_loss": records[-1]["lm_loss"],
        "losses": [r["lm_loss"] for r in records],
        "imbalance": {
            p: statistics.mean(r["imbalance"][p] for r in records) for p in records[0]["imbalance"]
        },
    }
    if "imbalance_balanced" in records[0]:
        out["imbalance_balanced"] = {
            p: statistics.mean(r["imbalance_balanced"][p] for r in records)
            for p in records[0]["imbalance_balanced"]
        }
        out["bytes_moved"] = statistics.mean(r["bytes_moved"] for r in records)
    return out
