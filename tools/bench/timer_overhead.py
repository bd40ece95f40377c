#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the timers cost: --timing-log-level 0, 1 and 2 on the same run.

Two measurements, because the host's drift (10-30% over minutes) is far larger than what the
timers should cost (under 1%):

1. **In one run** (the figure the target is about): per iteration, the spans the timers
   recorded times the cost of one span on this host (a tight loop of ``StepTimers.span``, the
   clock read twice and the record appended), plus the per-iteration all-gather of the timers,
   which the trainer times itself (``timers.gather_s``: one gather per ``--log-interval``,
   shared by its iterations), over the iteration time.
2. **Side by side**: the main job at levels 0, 1 and 2, interleaved (0 1 2 0 1 2 ...), the same
   data in every run; per round the ratio of each level's cost per iteration (iteration time
   plus the gather) to level 0's, then the median and the spread. It bounds the overhead by
   the host's noise; it cannot resolve 1%.

Usage: python tools/bench/timer_overhead.py [--rounds 3] [--iters 12] [--warmup 2]
       [--mode dp2-balanced|pp2-dynamic] [--log-interval 5]

Ends with one line ``timer_overhead_level1: R`` (the in-run ratio at level 1).
"""

from __future__ import annotations

import argparse
import statistics
import time

from cpu_runs import run_main_job

from megatron.mllm.timers import StepTimers

MODES = {
    "dp2-balanced": ["--post-balance", "auto"],
    "pp2-dynamic": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic"],
}


def span_cost_s(n: int = 200_000) -> float:
    """Seconds of one recorded span (two clock reads, one record) on this host."""
    timers = StepTimers(2)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n // 5):
            with timers.span("forward-compute", 2, "l0F3"):
                pass
        best = min(best, (time.perf_counter() - start) / (n // 5))
        timers.take()
    return best


def in_run_overhead(records: list[dict], span_s: float) -> dict[str, float]:
    """Median over iterations of the timers' cost over the iteration time (slowest rank's
    spans, the gather as the logging rank measured it)."""
    ratios, spans, gathers = [], [], []
    for r in records:
        t = r["timers"]
        n = max(t["spans"])
        cost = n * span_s + t["gather_s"]
        ratios.append(cost / r["iteration_time_s"])
        spans.append(n)
        gathers.append(t["gather_s"])
    return {
        "ratio": statistics.median(ratios),
        "spans": statistics.median(spans),
        "gather_ms": 1e3 * statistics.median(gathers),
    }


def cost_per_iteration(records: list[dict]) -> float:
    """Median of iteration time plus the timers' gather (0 at level 0)."""
    return statistics.median(
        r["iteration_time_s"] + r.get("timers", {}).get("gather_s", 0.0) for r in records
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--mode", choices=sorted(MODES), default="dp2-balanced")
    parser.add_argument("--log-interval", type=int, default=5,
                        help="the runs' --log-interval: one timer gather per interval (the main "
                        "job's 5; Megatron's default is 100)")  # fmt: skip
    args = parser.parse_args()
    span_s = span_cost_s()
    print(f"timers on the main job ({args.mode}), {args.iters} iterations per run, "
          f"{args.warmup} warm-up; one span costs {span_s * 1e6:.2f} us here")  # fmt: skip
    per_level: dict[int, list[float]] = {0: [], 1: [], 2: []}
    in_run: dict[int, list[dict]] = {1: [], 2: []}
    for rnd in range(args.rounds):
        for level in (0, 1, 2):
            flags = [*MODES[args.mode], "--timing-log-level", str(level)]
            records = run_main_job(
                f"level {level}", flags, args.iters, log_interval=args.log_interval
            )
            records = records[args.warmup :]
            per_level[level].append(cost_per_iteration(records))
            if level:
                in_run[level].append(in_run_overhead(records, span_s))
        ratios = [per_level[lv][-1] / per_level[0][-1] for lv in (1, 2)]
        print(f"round {rnd + 1}: ms per iteration level 0/1/2 "
              + "/".join(f"{per_level[lv][-1] * 1e3:.1f}" for lv in (0, 1, 2))
              + f" | level 1 / level 0 {ratios[0]:.3f}, level 2 / level 0 {ratios[1]:.3f}"
              + " | in run: " + ", ".join(
                  f"level {lv} {in_run[lv][-1]['ratio'] * 100:.2f}% ({in_run[lv][-1]['spans']:.0f}"
                  f" spans, gather {in_run[lv][-1]['gather_ms']:.2f} ms)" for lv in (1, 2)))  # fmt: skip
    summary = {}
    for lv in (1, 2):
        side = [a / b for a, b in zip(per_level[lv], per_level[0])]
        inside = [x["ratio"] for x in in_run[lv]]
        summary[lv] = statistics.median(inside)
        print(f"level {lv}: in-run overhead median {statistics.median(inside) * 100:.2f}% "
              f"(spread {min(inside) * 100:.2f}-{max(inside) * 100:.2f}%); side by side "
              f"level {lv} / level 0 median {statistics.median(side):.3f} "
              f"(spread {min(side):.3f}-{max(side):.3f})")  # fmt: skip
    print(f"timer_overhead_level2: {summary[2]:.4f}")
    print(f"timer_overhead_level1: {summary[1]:.4f}")


if __name__ == "__main__":
    main()
