#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's ``--overlap-grad-reduce`` on the main job: the DP gradient reduction after the
backward, against the same reduction in buckets started during it (``megatron.mllm.grad_overlap``).

Runs the main job (2 gloo ranks, DP=2, PP=1) in both ways, interleaved in rounds whose order
alternates (after, overlapped; overlapped, after; ...), on the same data, and prints per round
the ratio of the median iteration times (after / overlapped), the reduction each rank still
waits for at the end of the backward (megatron-core's ``all-grads-sync`` timer: the wait in
``finish_grad_sync``) and each rank's compute (:data:`COMPUTE`: where a reduction running
beside the compute costs it); then the rounds' median and spread, and SEMU's predicted ratio and wait
for the same runs (``tools/semu.py --model cpu-main --cluster cpu-2ranks`` with the
calibration). Both runs must learn the same: their losses are compared (the balanced step's
plans follow measured times, so its runs may differ in round-off).

The step is the per-phase balanced one (``--post-balance auto``, balancing every iteration),
or Megatron's (``--step megatron``). megatron-core's default bucket (40M parameters) holds the
whole tiny model, so nothing could start early: ``--bucket-size`` cuts it (default 20000
parameters, about 20 buckets).

With ``--param-gather`` both runs use the distributed optimizer and the overlapped reduction,
and the second also overlaps the parameters' all-gather with the next forward
(``--overlap-param-gather``, ``megatron.mllm.param_gather``); the wait is then the all-gather
in the optimizer step (``params-all-gather``) against what is left of it there.

Usage: python tools/bench/grad_overlap_cpu.py [--rounds 4] [--iters 40] [--warmup 10]
       [--step balanced|megatron] [--bucket-size 20000] [--param-gather] [--calibration FILE]
       [-- trainer flags]

Ends with one line ``grad_overlap_speedup: X`` (``param_gather_overlap_speedup: X`` with
``--param-gather``): the median of the rounds' ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys

from cpu_runs import run_main_job

from megatron.mllm.cli import semu as semu_cli
from megatron.mllm.cli.launch import REPO

STEPS = {
    "balanced": ["--post-balance", "auto", "--post-balance-guard-interval", "0"],
    "megatron": ["--post-balance", "none", "--pipeline-schedule", "megatron"],
}
WAIT = {False: "all-grads-sync", True: "params-all-gather"}
"""The wait measured: megatron-core's timer around ``finish_grad_sync`` (in
``finalize_model_grads``), or with ``--param-gather`` around the distributed optimizer's
all-gather in its step (not started when the gather overlaps)."""
COMPUTE = ("forward-compute", "backward-compute", "encoder-forward", "encoder-backward")
"""The timers of the step's computes (the balanced step's encoders run outside megatron-core's
forward and backward steps): what the reduction beside them costs shows there."""


def variants(bucket_size: int, param_gather: bool) -> dict[str, list[str]]:
    """The two runs compared: flags of each."""
    grads = ["--overlap-grad-reduce", "--ddp-bucket-size", str(bucket_size)]
    if param_gather:
        after = ["--use-distributed-optimizer", *grads]
        return {"after": after, "overlapped": [*after, "--overlap-param-gather"]}
    return {"after": [], "overlapped": grads}


def measure(records: list[dict], warmup: int, wait_timer: str) -> tuple[float, float, float]:
    """Median iteration time, and medians over iterations of the ranks' mean wait in
    ``wait_timer`` (0 where it did not run) and of their mean compute, all in ms, after the
    warm-up."""
    timed = records[warmup:]
    step = 1000 * statistics.median(r["iteration_time_s"] for r in timed)
    wait = 1000 * statistics.median(
        statistics.mean(r["timers"]["seconds"].get(wait_timer, [0.0])) for r in timed
    )

    def compute(record: dict) -> float:
        seconds = record["timers"]["seconds"]
        per_rank = zip(*(seconds[t] for t in COMPUTE if t in seconds))
        return statistics.mean(sum(ranks) for ranks in per_rank)

    return step, wait, 1000 * statistics.median(compute(r) for r in timed)


def predict(step: str, flags: list[str], calibration: str | None) -> tuple[float, float]:
    """SEMU's step time and exposed DP reduction plus optimizer (ms) for one run."""
    flags = [f if f != "--use-distributed-optimizer" else "--set=use-distributed-optimizer=true"
             for f in flags]  # fmt: skip
    argv = ["--model", "cpu-main", "--cluster", "cpu-2ranks", "--json",
            "--post-balance", "auto" if step == "balanced" else "none", *flags]  # fmt: skip
    if calibration:
        argv += ["--calibration", calibration]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = semu_cli.main(argv)
    if status != 0:
        sys.exit(err.getvalue().strip() or f"error: tools/semu.py {' '.join(argv)} failed")
    result = json.loads(out.getvalue())
    return 1000 * result["step_time_s"], 1000 * result["breakdown"]["allreduce_and_optimizer"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--step", choices=sorted(STEPS), default="balanced")
    parser.add_argument("--bucket-size", type=int, default=20000)
    parser.add_argument(
        "--param-gather",
        action="store_true",
        help="compare --overlap-param-gather's overlapped all-gather with the optimizer step's",
    )
    parser.add_argument(
        "--calibration",
        default=str(REPO / "scripts" / "configs" / "calibration-cpu.json"),
        help="SEMU's calibration for the prediction ('' for SEMU's defaults)",
    )
    parser.add_argument("flags", nargs="*", help="extra trainer flags (after --)")
    args = parser.parse_args()
    if args.rounds < 3 or args.warmup >= args.iters:
        sys.exit("error: --rounds must be >= 3 and --warmup < --iters")
    runs = variants(args.bucket_size, args.param_gather)
    wait_timer = WAIT[args.param_gather]
    base = [*STEPS[args.step], "--timing-log-level", "2", *args.flags]
    ratios, waits, computes, diffs = [], {k: [] for k in runs}, {k: [] for k in runs}, []
    print(f"step: {args.step}; buckets of {args.bucket_size} parameters; {args.iters} iterations "
          f"per run, the first {args.warmup} untimed")  # fmt: skip
    print("; ".join(f"{name}: {' '.join(flags) or 'no flag'}" for name, flags in runs.items()))
    print(
        "| round | after: ms/iter, wait, compute ms | overlapped: ms/iter, wait, compute ms | ratio |"
    )
    print("|---|---|---|---|")
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        got, losses = {}, {}
        for name in order:
            records = run_main_job(name, [*base, *runs[name]], args.iters)
            got[name] = measure(records, args.warmup, wait_timer)
            waits[name].append(got[name][1])
            computes[name].append(got[name][2])
            losses[name] = [x["lm_loss"] for x in records]
        diffs.append(
            max(abs(a - b) / abs(b) for a, b in zip(losses["overlapped"], losses["after"]))
        )
        ratio = got["after"][0] / got["overlapped"][0]
        ratios.append(ratio)
        cells = {k: ", ".join(f"{x:.1f}" for x in v) for k, v in got.items()}
        print(f"| {r + 1} | {cells['after']} | {cells['overlapped']} | {ratio:.3f} |")
    # The balanced step's plans follow its measured times (the online cost fit), so two runs
    # may form other microbatches and differ in round-off; Megatron's step measured 0 here.
    print(f"largest relative difference of a round's {args.iters} losses: {max(diffs):.1e}")
    median = statistics.median(ratios)
    print(f"measured ratio: median {median:.3f}, spread {min(ratios):.3f}-{max(ratios):.3f}; "
          f"wait in {wait_timer} (median of rounds): after "
          f"{statistics.median(waits['after']):.2f} ms, overlapped "
          f"{statistics.median(waits['overlapped']):.2f} ms; compute per rank: after "
          f"{statistics.median(computes['after']):.1f} ms, overlapped "
          f"{statistics.median(computes['overlapped']):.1f} ms")  # fmt: skip
    predicted = {name: predict(args.step, flags, args.calibration) for name, flags in runs.items()}
    print(f"SEMU: after {predicted['after'][0]:.1f} ms (reduction and optimizer "
          f"{predicted['after'][1]:.2f} ms), overlapped {predicted['overlapped'][0]:.1f} ms "
          f"({predicted['overlapped'][1]:.2f} ms): ratio "
          f"{predicted['after'][0] / predicted['overlapped'][0]:.3f}")  # fmt: skip
    name = "param_gather_overlap_speedup" if args.param_gather else "grad_overlap_speedup"
    print(f"{name}: {median:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
