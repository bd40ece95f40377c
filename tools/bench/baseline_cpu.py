#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The upstream-Megatron baseline on CPU: DP=2 and PP=2 side by side, on the same data.

Runs the main job (scripts/pretrain_mllm_cpu.sh, 2 gloo ranks) once per layout and prints,
per layout: median iteration time, samples/s, LLM tokens/s, model TFLOP/s per rank, and the
per-phase DP imbalance the trainer logs (max/mean of each phase's FLOPs across DP ranks,
averaged over iterations). The first iterations are warm-up and excluded from timings.

Usage: python tools/bench/baseline_cpu.py [--iters N] [--warmup K] [--workload SPEC] [-- extra flags]

Ends with one line ``baseline_pp2_over_dp2_throughput: R`` (tokens/s of PP=2 over DP=2).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_layout(name: str, flags: list[str], iters: int, extra: list[str]) -> list[dict]:
    """Run the main job with ``flags`` and return its per-iteration metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        env = dict(os.environ, PYTHON=sys.executable, NPROC="2", MASTER_PORT=str(_free_port()))
        env.setdefault("PYTHONWARNINGS", "ignore")
        cmd = [
            "bash",
            str(REPO / "scripts" / "pretrain_mllm_cpu.sh"),
            *flags,
            "--train-iters",
            str(iters),
            "--log-interval",
            str(iters),
            "--metrics-jsonl",
            str(metrics),
            *extra,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if proc.returncode != 0:
            sys.exit(f"error: the {name} run failed:\n{proc.stderr[-4000:]}")
        return [json.loads(line) for line in metrics.read_text().splitlines()]


def summarize(records: list[dict], warmup: int) -> dict:
    """Median-based figures over the timed iterations; imbalance over all of them."""
    timed = records[warmup:]
    seconds = statistics.median(r["iteration_time_s"] for r in timed)
    total_time = sum(r["iteration_time_s"] for r in timed)
    phases = records[0]["imbalance"].keys()
    return {
        "iteration_ms": 1000 * seconds,
        "samples_per_s": sum(r["samples"] for r in timed) / total_time,
        "tokens_per_s": sum(r["tokens"] for r in timed) / total_time,
        "tflops_per_rank": sum(r["flops"] for r in timed) / total_time / 2 / 1e12,
        "imbalance": {p: statistics.mean(r["imbalance"][p] for r in records) for p in phases},
        "final_loss": records[-1]["lm_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("extra", nargs="*", help="more trainer flags, after --")
    args = parser.parse_args()
    extra = ["--workload", args.workload, *args.extra]
    layouts = {
        "DP=2": ["--pipeline-model-parallel-size", "1"],
        "PP=2": ["--pipeline-model-parallel-size", "2"],
    }
    results = {
        name: summarize(run_layout(name, flags, args.iters, extra), args.warmup)
        for name, flags in layouts.items()
    }
    print(f"baseline (megatron-core schedules, encoders on stage 0) on {args.workload}, CPU, 2 ranks")
    print(f"{'layout':8s} {'iter ms':>9s} {'samples/s':>10s} {'tokens/s':>10s} {'TFLOP/s/rank':>13s}"
          f" {'final loss':>11s}  DP imbalance max/mean")  # fmt: skip
    for name, r in results.items():
        imb = " ".join(f"{p} {v:.3f}" for p, v in r["imbalance"].items())
        print(
            f"{name:8s} {r['iteration_ms']:9.1f} {r['samples_per_s']:10.2f} "
            f"{r['tokens_per_s']:10.1f} {r['tflops_per_rank']:13.5f} {r['final_loss']:11.4f}  {imb}"
        )
    ratio = results["PP=2"]["tokens_per_s"] / results["DP=2"]["tokens_per_s"]
    print(f"baseline_pp2_over_dp2_throughput: {ratio:.3f}")


if __name__ == "__main__":
    main()
