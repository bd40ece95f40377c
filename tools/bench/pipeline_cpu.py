#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dynamic interleaved pipeline on a real CPU run: PP=2, against upstream Megatron.

Runs the main job at PP=2 (2 gloo ranks) on the same data with:

- ``megatron``: megatron-core's 1F1B, encoders on stage 0, microbatches padded to a fixed shape;
- ``1f1b``: the same order and placement in OrchWeave's runtime, without padding (isolates what
  dropping the fixed shapes buys);
- ``dynamic``: every module cut over both stages, greedy dual-queue order per batch.

Prints each run's median iteration time and throughput and the ratios to ``megatron``, and
beside them SEMU's predicted ratios for the same iterations (``--calibration``: measured layer
times of this machine, from tools/calibrate.py). The runs' losses must agree.

Usage: python tools/bench/pipeline_cpu.py --calibration FILE [--iters N] [--warmup K]

Ends with one line ``dynamic_over_megatron_throughput: R``.
"""

from __future__ import annotations

import argparse

from cpu_runs import run_main_job, summarize

from megatron.mllm.cli.progress import progress
from megatron.mllm.config_files import find_config, load_run_config, set_flags
from orchestration.calibration import Calibration
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

RUNS = {
    "megatron": ["--pipeline-schedule", "megatron"],
    "1f1b": ["--pipeline-schedule", "1f1b"],
    "dynamic": ["--pipeline-schedule", "dynamic"],
}


def semu_step_times(
    schedule: str, pad: str, iterations: range, calibration: str, workload: str
) -> float:
    """Summed SEMU step time of the iterations, for one schedule of the PP=2 main job (the
    microbatches the trainer runs, as tools/semu.py builds them)."""
    cluster = ClusterSpec.load(find_config("cpu-2ranks"))
    spec = load_run_config(
        "cpu-main",
        set_flags({"pipeline-model-parallel-size": 2, "workload": workload}),
        world_size=cluster.num_devices,
    ).semu
    semu = Semu(spec, cluster, Calibration.load(calibration))
    total = 0.0
    for it in progress(iterations, f"SEMU {schedule} (pad {pad})", leave=False):
        schedules, mbs, _ = build_step(
            spec, cluster, schedule=schedule, pad=pad == "megatron", iteration=it
        )
        total += semu.simulate_step(schedules, mbs).step_time_s
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument(
        "--calibration", required=True, help="calibration JSON (tools/calibrate.py)"
    )
    args = parser.parse_args()
    common = [
        "--pipeline-model-parallel-size",
        "2",
        "--post-balance",
        "none",
        "--workload",
        args.workload,
    ]
    results = {
        name: summarize(run_main_job(name, [*common, *flags], args.iters), args.warmup)
        for name, flags in progress(RUNS.items(), "trainer runs")
    }
    timed = range(args.warmup, args.iters)
    predicted = {
        "megatron": semu_step_times("1f1b", "megatron", timed, args.calibration, args.workload),
        "1f1b": semu_step_times("1f1b", "none", timed, args.calibration, args.workload),
        "dynamic": semu_step_times("dynamic", "none", timed, args.calibration, args.workload),
    }
    base = results["megatron"]
    deviation = max(
        abs(a - b) / abs(a) for r in results.values() for a, b in zip(base["losses"], r["losses"])
    )
    print(f"pipeline schedules on {args.workload}, CPU, PP=2 (2 gloo ranks), same data")
    print(
        f"{'schedule':10s} {'iter ms':>9s} {'tokens/s':>10s} {'vs megatron':>12s} {'SEMU step ms':>13s} {'SEMU ratio':>11s}"
    )
    for name, r in results.items():
        semu_ms = 1000 * predicted[name] / len(timed)
        print(
            f"{name:10s} {r['iteration_ms']:9.1f} {r['tokens_per_s']:10.1f} "
            f"{r['tokens_per_s'] / base['tokens_per_s']:12.3f} {semu_ms:13.1f} "
            f"{predicted['megatron'] / predicted[name]:11.3f}"
        )
    print(f"largest relative loss difference between the runs: {deviation:.2e}")
    ratio = results["dynamic"]["tokens_per_s"] / base["tokens_per_s"]
    print(f"dynamic_over_megatron_throughput: {ratio:.3f}")


if __name__ == "__main__":
    main()
