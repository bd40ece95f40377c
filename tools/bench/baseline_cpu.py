#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The upstream-Megatron baseline on CPU: DP=2 and PP=2 side by side, on the same data.

Runs the main job (scripts/pretrain_mllm_cpu.sh, 2 gloo ranks) once per layout and prints,
per layout: median iteration time, samples/s, LLM tokens/s, model TFLOP/s per rank, and the
per-phase DP imbalance the trainer logs (max/mean of each phase's FLOPs across DP ranks,
averaged over iterations). The first iterations are warm-up and excluded from timings.

Usage: python tools/bench/baseline_cpu.py [--iters N] [--warmup K] [--workload SPEC]

Ends with one line ``baseline_pp2_over_dp2_throughput: R`` (tokens/s of PP=2 over DP=2).
"""

from __future__ import annotations

import argparse

from cpu_runs import run_main_job, summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workload", default="omni-three-modality")
    args = parser.parse_args()
    # The main job switches OrchWeave's features on; the baseline switches them off.
    baseline = ["--post-balance", "none", "--pipeline-schedule", "megatron"]
    layouts = {
        "DP=2": [*baseline, "--pipeline-model-parallel-size", "1"],
        "PP=2": [*baseline, "--pipeline-model-parallel-size", "2"],
    }
    results = {
        name: summarize(
            run_main_job(name, [*flags, "--workload", args.workload], args.iters), args.warmup
        )
        for name, flags in layouts.items()
    }
    print(
        f"baseline (megatron-core schedules, encoders on stage 0) on {args.workload}, CPU, 2 ranks"
    )
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
