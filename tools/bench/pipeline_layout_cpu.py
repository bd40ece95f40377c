#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where the layers live, measured: ``--pipeline-layout`` at PP=2 on a real CPU run.

Runs the main job at PP=2 (2 gloo ranks) on the same data, round after round, each round
running every variant once in turn, so that the host's drift hits all of them alike:

- ``megatron``: megatron-core's 1F1B (encoders on stage 0, padded microbatches): Megatron's
  default;
- ``1f1b``: the same order and layout in OrchWeave's runtime, without padding: the reference of
  every ratio;
- ``1f1b-balanced``: 1F1B on DIP's Megatron baseline, stages of balanced parameters;
- ``1f1b-balanced-cost``: 1F1B on stages of balanced cost (``--cost-calibration``'s);
- ``dynamic``: greedy dual-queue order per batch on DIP's layout, every module cut over both
  stages (the dynamic pipeline's default layout);
- ``dynamic-baseline``, ``dynamic-balanced-cost``: the same order on Megatron's layout and on
  stages of balanced cost;
- ``dynamic-auto``: the same order on the layout SEMU predicts fastest (``--pipeline-layout
  auto``, on the run's first iterations).

The dynamic variants run greedy's order (``--schedule-search-budget-ms 0``): the layouts, not
the search, are compared. Every run has ``--step-prediction``: SEMU's ratio for the same
iterations, with the same calibration, is printed beside each measured one.

Per round it prints each variant's median iteration time and its ratio to ``1f1b``; then per
variant the median ratio and spread over the rounds, SEMU's, and the largest difference of the
runs' final losses from ``1f1b``'s.

Usage: python tools/bench/pipeline_layout_cpu.py [--workload W] [--rounds R] [--iters N]
       [--warmup K] [--variants ...] [-- extra trainer flags]

Ends with one line ``balanced_cost_layout_speedup: X``: the median over the rounds of
``1f1b``'s iteration time over ``1f1b-balanced-cost``'s (the layout alone, one schedule).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from cpu_runs import median_iteration_ms, predicted_step_ms, run_main_job, split_trainer_flags

from megatron.mllm.cli.progress import progress
from megatron.mllm.config_files import CONFIG_DIR

CALIBRATION = str(CONFIG_DIR / "calibration-cpu.json")
"""The shipped CPU calibration: the costs of ``balanced-cost`` and SEMU's predictions."""

GREEDY = ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0"]
VARIANTS = {
    "megatron": ["--pipeline-schedule", "megatron"],
    "1f1b": ["--pipeline-schedule", "1f1b"],
    "1f1b-balanced": ["--pipeline-schedule", "1f1b", "--pipeline-layout", "balanced"],
    "1f1b-balanced-cost": ["--pipeline-schedule", "1f1b", "--pipeline-layout", "balanced-cost"],
    "dynamic": GREEDY,
    "dynamic-baseline": [*GREEDY, "--pipeline-layout", "baseline"],
    "dynamic-balanced-cost": [*GREEDY, "--pipeline-layout", "balanced-cost"],
    "dynamic-auto": [*GREEDY, "--pipeline-layout", "auto"],
}
REFERENCE = "1f1b"


def main() -> None:
    argv, extra = split_trainer_flags(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20, help="untimed iterations")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args(argv)
    if args.rounds < 3:
        sys.exit("error: --rounds must be >= 3 (one round says nothing on a drifting host)")
    if REFERENCE not in args.variants or "1f1b-balanced-cost" not in args.variants:
        sys.exit(f"error: --variants must include {REFERENCE} and 1f1b-balanced-cost")
    # Every run scores with the calibration as measured: the host probe would rescale it by
    # the host's speed at each run's start, which drifts, and move the cost-balanced stages.
    os.environ.setdefault("ORCHWEAVE_CALIBRATION_PROBE", "0")
    common = ["--pipeline-model-parallel-size", "2", "--post-balance", "none",
              "--workload", args.workload, "--cost-calibration", CALIBRATION,
              "--timing-log-level", "1", "--step-prediction", *extra]  # fmt: skip
    variants = {k: VARIANTS[k] for k in VARIANTS if k in args.variants}
    times: dict[str, list[float]] = {k: [] for k in variants}
    predicted: dict[str, list[float]] = {k: [] for k in variants}
    losses: dict[str, float] = {}
    for _ in progress(range(args.rounds), "rounds"):
        for name, flags in variants.items():
            records = run_main_job(name, [*common, *flags], args.iters)
            times[name].append(median_iteration_ms(records, args.warmup))
            p = predicted_step_ms(records, args.warmup)
            if p is not None:
                predicted[name].append(p)
            losses[name] = records[-1]["lm_loss"]
        ref = times[REFERENCE][-1]
        print(" ".join(f"{k} {times[k][-1]:.1f} ms ({ref / times[k][-1]:.3f})" for k in variants),
              flush=True)  # fmt: skip
    print(f"\n{args.workload}, PP=2, {args.rounds} rounds of {args.iters} iterations "
          f"({args.warmup} untimed); ratio = {REFERENCE}'s time / the variant's")  # fmt: skip
    print(f"{'variant':<24}{'median ms':>10}{'ratio':>8}{'spread':>16}{'SEMU':>8}{'loss diff':>11}")
    for name in variants:
        ratios = [r / t for r, t in zip(times[REFERENCE], times[name])]
        semu = "-"
        if predicted[name] and predicted[REFERENCE]:
            ratio = statistics.median(predicted[REFERENCE]) / statistics.median(predicted[name])
            semu = f"{ratio:.3f}"
        spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
        diff = abs(losses[name] - losses[REFERENCE])
        print(f"{name:<24}{statistics.median(times[name]):>10.1f}"
              f"{statistics.median(ratios):>8.3f}{spread:>16}{semu:>8}{diff:>11.2e}")  # fmt: skip
    layout = [r / t for r, t in zip(times[REFERENCE], times["1f1b-balanced-cost"])]
    print(f"balanced_cost_layout_speedup: {statistics.median(layout):.3f}")


if __name__ == "__main__":
    main()
