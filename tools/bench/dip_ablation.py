#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""DIP's ablation (Table 5) in SEMU: VLM-S on 16 H800, Megatron to DIP in five steps.

The steps (:mod:`pipeweaver.search.ablation` says exactly what each runs):

1. Megatron as DIP ran it: interleaved 1F1B (the config's 2 virtual stages) on the
   parameter-balanced layout (``tools/semu.py --placement balanced``), padded microbatches,
   the least recompute that fits 80 GB when the peak without recompute exceeds it (Megatron's
   block recompute of each chunk's least N layers, else every chunk; both peaks printed);
2. + the modality-aware partitioner (the trainer's ``--vision-chunks-per-stage auto
   --llm-chunks-per-stage auto --encoder-sub-microbatch-size auto``, from the model's FLOPs),
   still in Megatron's interleaved order over the partitioned stages: DIP reports the
   partitioner's gain before its interleaving, so only the layout and the sub-microbatches
   change here;
3. + greedy dual-queue interleaving under the memory limit (80 GB minus each rank's static
   bytes);
4. + MCTS segment reordering (``--rollouts`` rollouts, ``--seed``);
5. + per-pair memory optimisation (phase 3's ILP: keep, recompute or offload each pair).

Per step: SEMU's step time (mean over ``--batches`` iterations of the workload, one DP
replica), its speed-up over step 1, DIP's figure and DIP's speed-up (arXiv 2504.14145 v2,
Table 5: 26.13, 22.27, 18.81, 17.61, 16.05 s; docs/architecture.md [2]), the largest peak
memory per GPU and whether every batch fits the device.

Usage: python tools/bench/dip_ablation.py [--batches 2] [--rollouts 6] [--seed 0]
       [--model vlm-s] [--cluster h800-16] [--memory-limit-gb G] [--phase3-once] [--json FILE]

Ends with ``dip_ablation_total_speedup: X`` (step 1's mean time over step 5's; DIP's is 1.63).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from megatron.mllm.cli.args import quiet_config_files
from megatron.mllm.cli.progress import add_no_progress_flag, echo, progress

DIP_SETS = {
    "pipeline-schedule": "dynamic",
    "vision-chunks-per-stage": "auto",
    "llm-chunks-per-stage": "auto",
    "encoder-sub-microbatch-size": "auto",
}
"""The trainer's flags that ask for DIP's partitioner."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="vlm-s", help="model config")
    parser.add_argument("--cluster", default="h800-16", help="cluster config")
    parser.add_argument("--batches", type=int, default=2, help="iterations of the workload")
    parser.add_argument("--rollouts", type=int, default=6, help="MCTS rollouts beyond greedy")
    parser.add_argument("--seed", type=int, default=0, help="MCTS seed")
    parser.add_argument("--memory-limit-gb", type=float, help="memory per device (GiB)")
    parser.add_argument(
        "--phase3-once",
        action="store_true",
        help="step 5: phase 3 once on the best order and greedy's (the trainer's), not per rollout",
    )
    parser.add_argument("--json", help="write every figure here")
    add_no_progress_flag(parser)
    args = parser.parse_args(argv)
    if args.batches < 1 or args.rollouts < 0:
        print("error: --batches must be >= 1 and --rollouts >= 0", file=sys.stderr)
        return 2
    configs = quiet_config_files()
    from megatron.mllm.partitioning import partition_plan
    from pipeweaver.search.ablation import DIP_TABLE5_S, ablation_steps, format_table
    from pipeweaver.search.memory_limit import GIB
    from pipeweaver.semu.hardware import ClusterSpec
    from pipeweaver.semu.simulator import Semu

    cluster = ClusterSpec.load(configs.find_config(args.cluster))
    loaded = configs.load_run_config(args.model, {}, world_size=cluster.num_devices)
    dip = configs.load_run_config(
        args.model, configs.set_flags(DIP_SETS), world_size=cluster.num_devices
    )
    plan = partition_plan(dip.run, dip.model)
    spec = loaded.semu
    semu = Semu(spec, cluster)
    echo(f"DIP ablation: {spec.name} on {cluster.name}, {args.batches} batches, "
         f"{args.rollouts} rollouts, seed {args.seed}")  # fmt: skip
    for line in plan.explain():
        echo(f"  {line}")
    batches, seconds = [], []
    for it in progress(range(args.batches), "batches", leave=False):
        t0 = time.perf_counter()
        batches.append(
            ablation_steps(
                semu, spec, cluster, plan, iteration=it, rollouts=args.rollouts, seed=args.seed,
                memory_limit_gb=args.memory_limit_gb, refine_every_rollout=not args.phase3_once,
            )  # fmt: skip
        )
        seconds.append(time.perf_counter() - t0)
    for line in format_table(batches):
        print(line)
    mean = [sum(b[i].step_time_s for b in batches) / len(batches) for i in range(len(DIP_TABLE5_S))]
    print(f"bench time: {sum(seconds):.1f} s ({sum(seconds) / len(seconds):.1f} s per batch)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                [
                    [
                        {
                            "step": s.name,
                            "iteration": it,
                            "step_time_s": s.step_time_s,
                            "mfu": s.mfu,
                            "peak_memory_gib": [b / GIB for b in s.peak_memory_bytes],
                            "fits": s.fits,
                            "memory": s.memory,
                            "block_recompute_layers": s.block_recompute_layers,
                        }
                        for s in b
                    ]
                    for it, b in enumerate(batches)
                ],
                f,
                indent=1,
            )
    print(f"dip_ablation_total_speedup: {mean[0] / mean[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
