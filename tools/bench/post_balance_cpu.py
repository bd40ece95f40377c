#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Batch post-balancing on a real CPU run: DP=2, with and without, on the same data.

Runs the main job (2 gloo ranks, PP=1) twice on the same global batches: upstream Megatron's
assignment (``--post-balance none``) and OrchWeave's per-phase balancing (``--post-balance
auto``). Prints each run's median iteration time and throughput, their ratio, and beside it
the *ideal* ratio computed from the metadata alone: per iteration, the baseline's step is set
by the slowest rank's summed work over all phases, ``max_r sum_p c[r, p]``; the balanced step
runs each phase to completion everywhere before the next, ``sum_p max_r c'[r, p]``, with the
plan's assignment ``c'``; costs are the balancer's (FLOPs, or seconds with --calibration).
Both runs' losses must agree (same global batch).

Usage: python tools/bench/post_balance_cpu.py [--iters N] [--warmup K] [--workload SPEC]
       [--calibration FILE]

Ends with one line ``post_balance_throughput_ratio: R``.
"""

from __future__ import annotations

import argparse

import numpy as np
from cpu_runs import run_main_job, summarize

from megatron.mllm.config_files import load_run_config, set_flags
from orchestration.calibration import Calibration
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata
from orchestration.packing import microbatch_indices
from orchestration.phase_plan import plan_iteration
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

MEGATRON = ["--pipeline-model-parallel-size", "1", "--pipeline-schedule", "megatron"]


def megatron_rank_samples(gen, iteration: int, dp: int, mbs: int, num_mb: int):
    """Every DP rank's (stream index, metadata), as Megatron's sampler hands them out."""
    return [
        [(k, gen.sample(k)) for mb in microbatch_indices(iteration, r, dp, mbs, num_mb) for k in mb]
        for r in range(dp)
    ]


def ideal_ratio(workload: str, iters: int, calibration: str | None) -> tuple[float, dict]:
    """Baseline over balanced predicted step time, summed over the iterations."""
    dp = 2
    spec = load_run_config("cpu-main", set_flags({"workload": workload}), world_size=dp).semu
    t = spec.training
    gen = WorkloadGenerator(
        WorkloadSpec.load(workload), seed=t.workload_seed, token_scale=t.workload_token_scale
    )
    cal = Calibration.load(calibration) if calibration else None
    cost = CostModel.build(spec.shape, cal)
    mbs = t.micro_batch_size
    num_mb = t.global_batch_size // (mbs * dp)
    before = after = 0.0
    for it in range(iters):
        md = GatheredMetadata.from_rank_samples(megatron_rank_samples(gen, it, dp, mbs, num_mb))
        plan = plan_iteration(md, cost, algorithm="auto", gpus_per_node=2)
        loads_before = np.sum([p.loads_before for p in plan.phases], axis=0)
        before += float(loads_before.max())
        after += float(sum(p.loads_after.max() for p in plan.phases))
    return before / after, {"unit": cost.unit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("--calibration", help="calibration JSON for the ideal ratio's costs")
    args = parser.parse_args()
    common = [*MEGATRON, "--workload", args.workload]
    runs = {
        "none": summarize(
            run_main_job("baseline", [*common, "--post-balance", "none"], args.iters), args.warmup
        ),
        "auto": summarize(
            run_main_job("balanced", [*common, "--post-balance", "auto"], args.iters), args.warmup
        ),
    }
    base, bal = runs["none"], runs["auto"]
    deviation = max(abs(a - b) / abs(a) for a, b in zip(base["losses"], bal["losses"]))
    ideal, info = ideal_ratio(args.workload, args.iters, args.calibration)
    print(f"batch post-balancing on {args.workload}, CPU, DP=2 (PP=1), same global batches")
    print(
        f"{'run':10s} {'iter ms':>9s} {'samples/s':>10s} {'tokens/s':>10s}  imbalance max/mean per phase"
    )
    for name, r in runs.items():
        after = r.get("imbalance_balanced", {})
        imb = " ".join(
            f"{p} {v:.3f}" + (f"->{after[p]:.3f}" if p in after else "")
            for p, v in r["imbalance"].items()
        )
        print(
            f"{name:10s} {r['iteration_ms']:9.1f} {r['samples_per_s']:10.2f} {r['tokens_per_s']:10.1f}  {imb}"
        )
    ratio = bal["tokens_per_s"] / base["tokens_per_s"]
    print(f"bytes moved per iteration (balanced): {bal['bytes_moved'] / 1e6:.3f} MB")
    print(f"largest relative loss difference between the runs: {deviation:.2e}")
    print(f"ideal ratio from the metadata ({info['unit']}): {ideal:.3f}")
    print(f"measured throughput ratio (balanced / baseline): {ratio:.3f}")
    print(f"post_balance_throughput_ratio: {ratio:.3f}")


if __name__ == "__main__":
    main()
