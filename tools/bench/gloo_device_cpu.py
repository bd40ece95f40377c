#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""One gloo transport device per process (``megatron.mllm.distributed.share_gloo_device``, the
default) against torch's one device per process group (``ORCHWEAVE_GLOO_DEVICE_PER_GROUP=1``),
on the main job.

Each gloo device has a thread that wakes every 10 ms; with a device per group the main job's
24-26 groups per process interrupt each rank's compute some 2,500 times a second, and at PP=2
the runtime's posts stall now and then for 80-1,200 ms (a transport thread spinning on a lock
its rank's preempted thread holds; README, Running on CPU). So the figures are the *mean*
iteration time (what a run's length follows), the median (what a stall does not move) and the
stalls themselves (iterations over twice their run's median).

Runs the main job both ways, interleaved in rounds whose order alternates (per group, shared;
shared, per group; ...), on the same data, and prints per round each run's mean, median and
slowest iteration and its stalls, and the ratios (a device per group over one shared) of the
means and the medians; then the median and spread of the ratios over the rounds. The losses
must agree: the transport changes no arithmetic (the balanced step's plans follow measured
times, so its losses may differ in round-off).

Usage: python tools/bench/gloo_device_cpu.py [--step greedy|1f1b|megatron|megatron-pp1|balanced]
       [--rounds 4] [--iters 80] [--warmup 10] [-- trainer flags]

Ends with one line ``gloo_shared_device_mean_speedup: X``: the median over the rounds of the
mean iteration time with a device per group over that with one shared device.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

from cpu_runs import run_main_job, split_trainer_flags

STEPS = {
    "greedy": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
               "--schedule-search-budget-ms", "0", "--post-balance", "none"],
    "1f1b": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b",
             "--post-balance", "none"],
    "megatron": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "megatron",
                 "--post-balance", "none"],
    "megatron-pp1": ["--pipeline-schedule", "megatron", "--post-balance", "none"],
    "balanced": ["--post-balance", "auto", "--post-balance-guard-interval", "0"],
}  # fmt: skip
"""PP=2 in OrchWeave's runtime (the dynamic greedy order, 1F1B) and in megatron-core's engine;
PP=1 DP=2 with Megatron's step and with per-phase post-balancing every iteration."""
ARMS = ("per group", "shared")
ENV = "ORCHWEAVE_GLOO_DEVICE_PER_GROUP"


def run_times(records: list[dict], warmup: int) -> dict:
    """Mean, median and slowest iteration (ms) and the stalls of one run."""
    times = [1000 * r["iteration_time_s"] for r in records[warmup:]]
    median = statistics.median(times)
    return {
        "mean": statistics.mean(times),
        "median": median,
        "max": max(times),
        "stalls": sum(t > 2 * median for t in times),
        "losses": [r["lm_loss"] for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", choices=sorted(STEPS), default="greedy")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=10)
    own, extra = split_trainer_flags(sys.argv[1:])
    args = parser.parse_args(own)
    if args.rounds < 3:
        sys.exit("error: --rounds must be at least 3 (each round's ratio, their median, spread)")
    if args.iters <= args.warmup + 10:
        sys.exit("error: --iters must exceed --warmup by more than 10")
    flags = [*STEPS[args.step], *extra]
    print(f"step: {args.step} ({' '.join(flags)}), {args.iters} iterations, first "
          f"{args.warmup} untimed; gloo: a device per group against one shared")  # fmt: skip
    mean_ratios, median_ratios, stalls = [], [], dict.fromkeys(ARMS, 0)
    for r in range(args.rounds):
        order = ARMS if r % 2 == 0 else ARMS[::-1]
        got = {}
        for arm in order:
            os.environ[ENV] = "1" if arm == "per group" else "0"
            records = run_main_job(arm, flags, args.iters, log_interval=10)
            got[arm] = run_times(records, args.warmup)
            stalls[arm] += got[arm]["stalls"]
        os.environ.pop(ENV)
        pairs = zip(got["per group"]["losses"], got["shared"]["losses"])
        if not all(math.isclose(a, b, rel_tol=1e-4) for a, b in pairs):
            sys.exit(f"error: round {r + 1}: the two runs' losses differ")
        mean_ratios.append(got["per group"]["mean"] / got["shared"]["mean"])
        median_ratios.append(got["per group"]["median"] / got["shared"]["median"])
        cells = "; ".join(
            f"{arm}: mean {got[arm]['mean']:.1f} ms, median {got[arm]['median']:.1f} ms, "
            f"slowest {got[arm]['max']:.1f} ms, {got[arm]['stalls']} stalls"
            for arm in ARMS
        )
        print(f"round {r + 1} ({order[0]} first): {cells}; ratio of the means "
              f"{mean_ratios[-1]:.3f}, of the medians {median_ratios[-1]:.3f}", flush=True)  # fmt: skip
    for name, ratios in (("means", mean_ratios), ("medians", median_ratios)):
        print(f"ratio of the {name} (per group / shared): median {statistics.median(ratios):.3f} "
              f"(spread {min(ratios):.3f}-{max(ratios):.3f})")  # fmt: skip
    timed = args.rounds * (args.iters - args.warmup)
    print(f"stalls (iterations over twice their run's median) in {timed} timed iterations each: "
          f"a device per group {stalls['per group']}, shared {stalls['shared']}")  # fmt: skip
    print(f"gloo_shared_device_mean_speedup: {statistics.median(mean_ratios):.3f}")


if __name__ == "__main__":
    main()
