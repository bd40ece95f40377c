#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measured vs SEMU-predicted step-time ratio of two pipeline schedules on the CPU main job.

Runs ``scripts/pretrain_mllm_cpu.sh`` at PP = 2 with each schedule, interleaved (A B A B ...),
with ``--step-prediction``; prints per run the median measured and predicted iteration time, and
the measured and predicted ratios B/A (median over the rounds)::

    python tools/bench/semu_ratio_cpu.py --rounds 3 --iters 16 \
        --calibration scripts/configs/calibration-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from cpu_runs import run_main_job

SCHEDULES = {
    "1f1b": ["--pipeline-schedule", "1f1b"],
    "dynamic": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0"],
    "searched": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "200"],
}
"""``dynamic`` is the greedy order; ``searched`` adds the schedule search."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=16)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--calibration", default="scripts/configs/calibration-cpu.json")
    p.add_argument("--a", default="1f1b", choices=list(SCHEDULES))
    p.add_argument("--b", default="dynamic", choices=list(SCHEDULES))
    p.add_argument("--extra", default="", help="more flags for both runs (one string)")
    p.add_argument("--dump", help="write every run's metrics records to this JSON file")
    args = p.parse_args()
    common = ["--pipeline-model-parallel-size", "2", "--step-prediction",
              "--timing-log-level", "1", "--cost-calibration", args.calibration,
              *args.extra.split()]  # fmt: skip
    ratios_m, ratios_p, dumped = [], [], []
    for rnd in range(args.rounds):
        got = {}
        for name in (args.a, args.b):
            recs = run_main_job(name, common + SCHEDULES[name], args.iters)[args.warmup :]
            dumped.append({"round": rnd, "schedule": name, "records": recs})
            meas = statistics.median(r["iteration_time_s"] for r in recs)
            pred = statistics.median(r["prediction"]["step_s"] for r in recs if "prediction" in r)
            got[name] = (meas, pred)
            print(f"round {rnd} {name}: measured {meas * 1e3:.1f} ms predicted {pred * 1e3:.1f} ms",
                  flush=True)  # fmt: skip
        ratios_m.append(got[args.a][0] / got[args.b][0])
        ratios_p.append(got[args.a][1] / got[args.b][1])
        print(f"round {rnd} {args.a}/{args.b}: measured {ratios_m[-1]:.3f} predicted "
              f"{ratios_p[-1]:.3f}", flush=True)  # fmt: skip
    if args.dump:
        Path(args.dump).write_text(json.dumps(dumped))
    m, pr = statistics.median(ratios_m), statistics.median(ratios_p)
    print(f"measured_ratio: {m:.3f} (spread {min(ratios_m):.3f}-{max(ratios_m):.3f})")
    print(f"predicted_ratio: {pr:.3f}")
    print(f"ratio_error: {abs(pr / m - 1) * 100:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
