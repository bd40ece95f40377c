# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Shared by the CPU benchmarks: run the main job with overrides, summarise its metrics.

Runs happen one after another on the same machine, on the same data (same workload, seed and
global batches), so their ratios compare like with like; the first iterations are warm-up.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from megatron.mllm.cli.launch import MAIN_JOB, REPO, free_port

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
