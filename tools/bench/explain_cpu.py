#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where the predicted gains go: explain_step on the two CPU comparisons, interleaved A/B.

Cases (the main job, 2 gloo ranks, the same global batches in every run):

- ``dp``: DP=2, PP=1. A = upstream Megatron's assignment (``--post-balance none
  --pipeline-schedule megatron``), B = OrchWeave's per-phase balancing (``--post-balance
  auto``). The prediction is the plan's (FLOP cost model unless ``--calibration``), and A's is
  the same plan's loads before balancing: their ratio is the metadata's ideal gain.
- ``pp``: PP=2, DP=1, no post-balancing. A = the runtime's ``1f1b``, B = ``dynamic``. The
  prediction is SEMU's, calibrated by ``--cost-calibration`` (``scripts/configs/
  calibration-cpu.json`` unless ``--calibration``), for the microbatches and schedule each
  iteration ran.

Every run trains with ``--timing-log-level 2 --step-prediction``; the runs go A B A B A B
(``--rounds``). Per round: the measured gain (A's median iteration time over B's) beside the
predicted one; then their median and spread; then explain_step's report of the median round:
A, B, and per term where the predicted gain went.

Usage: python tools/bench/explain_cpu.py [--case dp|pp|both] [--rounds 3] [--iters 12]
       [--warmup 2] [--calibration FILE]

Ends with one line ``explain_<case>_measured_gain: R`` (the last case's median).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from cpu_runs import run_main_job

from megatron.mllm.cli.launch import REPO
from megatron.mllm.explain import format_comparison, format_run, summarize_pair

TIMED = ["--timing-log-level", "2", "--step-prediction"]
CASES = {
    "dp": {
        "title": "DP=2 per-phase balancing (auto) against Megatron's assignment (none)",
        "A": ["--post-balance", "none", "--pipeline-schedule", "megatron"],
        "B": ["--post-balance", "auto", "--pipeline-schedule", "megatron"],
        "name": "explain_dp2_balanced_measured_gain",
    },
    "pp": {
        "title": "PP=2 dynamic against the runtime's 1f1b",
        "A": ["--pipeline-model-parallel-size", "2", "--post-balance", "none",
              "--pipeline-schedule", "1f1b"],
        "B": ["--pipeline-model-parallel-size", "2", "--post-balance", "none",
              "--pipeline-schedule", "dynamic"],
        "name": "explain_pp2_dynamic_measured_gain",
    },
}  # fmt: skip


def _median_time(records: list[dict]) -> float:
    return statistics.median(r["iteration_time_s"] for r in records)


def run_case(case: str, rounds: int, iters: int, warmup: int, calibration: str | None) -> float:
    """Interleaved rounds of one case; prints them and the median round's explanation."""
    spec = CASES[case]
    extra = []
    if case == "pp":
        extra = [
            "--cost-calibration",
            calibration or str(REPO / "scripts/configs/calibration-cpu.json"),
        ]
    elif calibration:
        extra = ["--cost-calibration", calibration]
    print(f"== {spec['title']}: {rounds} rounds A B, {iters} iterations each, {warmup} warm-up")
    results = []
    for rnd in range(rounds):
        runs = {ab: run_main_job(f"{case} {ab}", [*spec[ab], *TIMED, *extra], iters)
                for ab in ("A", "B")}  # fmt: skip
        a, b = summarize_pair(runs["A"], runs["B"], warmup)
        measured = _median_time(runs["A"][warmup:]) / _median_time(runs["B"][warmup:])
        pa, pb = a.step("predicted"), b.step("predicted")
        predicted = pa / pb if pa and pb else float("nan")
        results.append((measured, predicted, a, b))
        print(f"round {rnd + 1}: iteration A {_median_time(runs['A'][warmup:]) * 1e3:.1f} ms, "
              f"B {_median_time(runs['B'][warmup:]) * 1e3:.1f} ms: measured gain {measured:.3f}, "
              f"predicted {predicted:.3f}")  # fmt: skip
    gains = [r[0] for r in results]
    preds = [r[1] for r in results]
    print(f"measured gain: median {statistics.median(gains):.3f} (spread {min(gains):.3f}-"
          f"{max(gains):.3f}); predicted: median {statistics.median(preds):.3f} (spread "
          f"{min(preds):.3f}-{max(preds):.3f})")  # fmt: skip
    _, _, a, b = sorted(results, key=lambda r: r[0])[len(results) // 2]
    print("-- explain_step of the median round")
    print("\n".join(["A:", *format_run(a), "", "B:", *format_run(b), "", *format_comparison(a, b)]))
    return statistics.median(gains)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", choices=["dp", "pp", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--calibration", help="calibration JSON (orchweave-calibrate)")
    args = parser.parse_args()
    cases = ["dp", "pp"] if args.case == "both" else [args.case]
    if args.calibration:  # the runs start in the repository root
        args.calibration = str(Path(args.calibration).resolve())
    gains = {c: run_case(c, args.rounds, args.iters, args.warmup, args.calibration) for c in cases}
    for c in cases:
        print(f"{CASES[c]['name']}: {gains[c]:.3f}")


if __name__ == "__main__":
    main()
