#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What packed sequences (``--pack-sequences``) buy Megatron's step and the balanced one.

The strong Megatron baseline packs each DP rank's samples first-fit decreasing into sequences
of at most ``--micro-batch-size x --seq-length`` tokens, one per microbatch (Megatron-LM's
packed-sequence data; SEMU's ``--pad packed``), instead of running ``--micro-batch-size``
samples per microbatch. On a workload of short samples that is far fewer microbatches, and on a
host whose step is mostly per-call overhead (this 2-core CPU) far less time. The balanced step
(``--post-balance auto``) then forms the fewest LLM microbatches within the same limit.

Runs the main job (DP=2, PP=1) in four variants, interleaved round by round on the same
batches: Megatron's step as loaded (``none``), Megatron's step packed (``none-packed``), and the
balanced step as loaded and packed (``auto``, ``auto-packed``, the post-balance guard off so
that every iteration balances). Per round and variant the median iteration time after the
warm-up; per round the ratios against ``none-packed``, the strong baseline; then each ratio's
median and spread over the rounds. Every variant's losses must agree (the same samples, the
loss normalised by the global token count).

Separate runs compare iterations minutes apart on a host whose speed drifts by 10-30%, so a
ratio closer to 1 than the rounds' spread is not resolved; the balanced step's own gain over
the packed baseline is measured as a crossover by ``post_balance_cpu.py -- --pack-sequences``.

Usage: python tools/bench/packing_cpu.py [--workload W] [--rounds 3] [--iters 60]
       [--warmup 15] [-- extra trainer flags]

Ends with one line ``packed_over_loaded_megatron_speedup: X``: the median over the rounds of
Megatron's step as loaded over Megatron's step packed (iteration time).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from cpu_runs import run_main_job, split_trainer_flags

MEGATRON = ["--pipeline-model-parallel-size", "1", "--pipeline-schedule", "megatron"]
VARIANTS = {
    "none": ["--post-balance", "none"],
    "none-packed": ["--post-balance", "none", "--pack-sequences"],
    "auto": ["--post-balance", "auto", "--post-balance-guard-interval", "0"],
    "auto-packed": ["--post-balance", "auto", "--post-balance-guard-interval", "0",
                    "--pack-sequences"],
}  # fmt: skip
STRONG = "none-packed"
"""The baseline every ratio is against: what a good Megatron user runs on short samples."""


def main() -> None:
    own, extra = split_trainer_flags(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (at least 3)")
    parser.add_argument("--iters", type=int, default=60, help="iterations per run")
    parser.add_argument("--warmup", type=int, default=15, help="iterations left out first")
    args = parser.parse_args(own)
    if args.rounds < 3:
        parser.error(f"--rounds {args.rounds}: a comparison needs at least 3 interleaved rounds")
    if args.warmup >= args.iters:
        parser.error(f"--warmup {args.warmup} leaves none of --iters {args.iters}")
    print(f"packed sequences on {args.workload}, CPU, DP=2 (PP=1), same batches; {args.rounds} "
          f"rounds of {', '.join(VARIANTS)} interleaved, {args.iters} iterations each, "
          f"{args.warmup} warm-up")  # fmt: skip
    rounds: list[dict[str, float]] = []
    microbatches: dict[str, float] = {}
    losses: dict[str, list[float]] = {}
    for r in range(args.rounds):
        times = {}
        for name, flags in VARIANTS.items():
            records = run_main_job(f"{name} (round {r + 1})",
                                   [*MEGATRON, "--workload", args.workload, *flags, *extra],
                                   args.iters)  # fmt: skip
            timed = records[args.warmup :]
            times[name] = statistics.median(x["iteration_time_s"] for x in timed)
            losses[name] = [x["lm_loss"] for x in records]
            counts = [x.get("num_microbatches") or 0 for x in timed]
            microbatches[name] = statistics.mean(counts) if any(counts) else float("nan")
        rounds.append(times)
        text = ", ".join(
            f"{n} {t * 1e3:.1f} ms ({times[STRONG] / t:.3f})" for n, t in times.items()
        )
        print(f"round {r + 1}: {text}")
    print(f"iteration time against {STRONG} (its time over the variant's; above 1: faster):")
    for name in VARIANTS:
        ratios = [t[STRONG] / t[name] for t in rounds]
        print(f"  {name:12s} median {statistics.median(ratios):.3f}, spread "
              f"{min(ratios):.3f}-{max(ratios):.3f}")  # fmt: skip
    print(
        "LLM microbatches per rank and balanced iteration: "
        f"auto {microbatches['auto']:.2f}, auto-packed {microbatches['auto-packed']:.2f}"
    )
    reference = losses["none"]
    worst = max(abs(a - b) / abs(b) for l in losses.values() for a, b in zip(l, reference))
    print(f"largest relative loss difference between variants: {worst:.1e}")
    speedup = statistics.median(t["none"] / t[STRONG] for t in rounds)
    print(f"packed_over_loaded_megatron_speedup: {speedup:.3f}")


if __name__ == "__main__":
    main()
