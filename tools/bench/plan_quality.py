#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Plan quality and planning time of the post-balancer on every built-in workload spec.

For each spec and each DP size (8, 64, 512, 2560 unless told) with 8 samples per rank, the
global batch is the first ``DP x 8`` samples of the spec's stream (seed 0), gathered as the
trainer's metadata all-gather would. It reports, per phase:

* max/mean of the ranks' predicted costs before balancing, after ``plan_iteration`` (the
  planner: ``auto``), and after plain LPT over whole samples (the reference to beat);
* the ratio of the planner's max load to the lower bound (``orchestration.bounds``) and, at
  DP <= 16, to the ILP optimum where HiGHS proves one within ``--ilp-seconds``;
* the fraction of items moved.

and per (spec, DP) the CPU time of ``plan_iteration`` for all phases together (the fastest of
``--repeats`` runs, in process CPU time: other load on a shared machine only adds to it; the
median is in the JSON), and of rebuilding the gathered table from the all-gathered arrays
(``GatheredMetadata.from_flat``).

Usage: python tools/bench/plan_quality.py [--dp 8 64 512 2560] [--model cpu-main]
       [--specs NAME ...] [--ilp-seconds 3] [--repeats 3] [--json FILE] [--no-progress]

On a terminal a bar counts the (spec, DP) pairs on stderr.

Ends with ``name: value`` lines; the last is ``plan_ms_dp2560_max: X`` (the slowest spec at
the largest DP). No test asserts on these times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from megatron.mllm.arguments import ONE_REPLICA
from megatron.mllm.cli.progress import add_no_progress_flag, echo, progress
from megatron.mllm.config_files import load_run_config
from orchestration.balance import balance, max_over_mean
from orchestration.bounds import lower_bound
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata, encode_rank_metadata, phase_items
from orchestration.phase_plan import plan_iteration
from orchestration.sample_plan import sample_phase_costs
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec, builtin_specs

SAMPLES_PER_RANK = 8
"""Samples each DP rank loads."""

ILP_MAX_DP = 16
"""The ILP runs only up to this DP..."""

ILP_MAX_ITEMS = 400
"""...and this many items per phase."""


def bench_one(
    spec_name: str, samples, dp: int, cost_model: CostModel, ilp_seconds: float, repeats: int
) -> dict:
    """Numbers of one (spec, DP)."""
    k = SAMPLES_PER_RANK
    ranks = [[(r * k + j, samples[r * k + j]) for j in range(k)] for r in range(dp)]
    flat = [encode_rank_metadata(x) for x in ranks]
    gather_ms, plan_ms = [], []
    for _ in range(repeats):
        t = time.process_time()
        md = GatheredMetadata.from_flat(flat)
        gather_ms.append(1000 * (time.process_time() - t))
        t = time.process_time()
        plan = plan_iteration(md, cost_model)
        plan_ms.append(1000 * (time.process_time() - t))
    per_sample = sample_phase_costs(md, cost_model)
    total = np.sum(list(per_sample.values()), axis=0)
    llm = phase_items(md, "llm")
    ref = balance(
        total, dp, algorithm="lpt", owners=llm.owner, item_bytes=llm.tokens, keep_ordinary=False
    )
    # The fastest of the repeats: other load on a shared machine only ever adds time.
    out = {
        "spec": spec_name,
        "dp": dp,
        "plan_ms": min(plan_ms),
        "plan_ms_median": statistics.median(plan_ms),
        "gather_ms": min(gather_ms),
        "phases": {},
    }
    for p in plan.phases:
        if p.items.size == 0:
            continue
        ref_loads = np.bincount(ref.bins[p.items.sample], weights=p.costs, minlength=dp)
        use_ilp = ilp_seconds > 0 and dp <= ILP_MAX_DP and p.items.size <= ILP_MAX_ITEMS
        lb = lower_bound(p.costs, dp, ilp=use_ilp, time_limit=ilp_seconds, incumbent=p.dispatch.dst)
        after_max = float(p.loads_after.max())
        out["phases"][p.phase] = {
            "items": p.items.size,
            "before": p.imbalance_before,
            "after": p.imbalance_after,
            "sample_lpt": max_over_mean(ref_loads),
            "ratio_lb": after_max / lb.value if lb.value > 0 else 1.0,
            "ratio_opt": after_max / lb.proven_optimum if lb.proven_optimum else None,
            "sample_lpt_ratio_lb": float(ref_loads.max()) / lb.value if lb.value > 0 else 1.0,
            "moved": p.moved_fraction,
            "algorithm": p.algorithm,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dp", type=int, nargs="+", default=[8, 64, 512, 2560])
    ap.add_argument("--model", default="cpu-main", help="model config (scripts/configs)")
    ap.add_argument("--specs", nargs="+", default=None, help="default: every built-in spec")
    ap.add_argument("--ilp-seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--token-scale", type=float, default=None, help="default: the config's")
    ap.add_argument("--json", help="also write every number to this JSON file")
    add_no_progress_flag(ap)
    args = ap.parse_args()
    # One model replica: the DP sizes benchmarked are --dp, not the config's layout.
    model = load_run_config(args.model, world_size=ONE_REPLICA)
    scale = (
        model.run.workload.workload_token_scale if args.token_scale is None else args.token_scale
    )
    cost_model = CostModel.build(model.shape)
    rows = []
    pairs = [(spec, dp) for spec in args.specs or builtin_specs() for dp in args.dp]
    sampled, samples = None, []
    for spec, dp in progress(pairs, "plan quality"):
        if spec != sampled:  # the pairs come spec by spec: generate once, for the largest DP
            gen = WorkloadGenerator(WorkloadSpec.load(spec), seed=0, token_scale=scale)
            sampled, samples = spec, gen.samples(max(args.dp) * SAMPLES_PER_RANK)
        rows.append(bench_one(spec, samples, dp, cost_model, args.ilp_seconds, args.repeats))
        echo(f"... {spec} DP={dp}: plan {rows[-1]['plan_ms']:.1f} ms", file=sys.stderr)
    print(
        f"model {args.model}, token scale {scale}, {SAMPLES_PER_RANK} samples per rank; "
        f"max/mean of predicted per-rank phase cost (1.0 = perfect)"
    )
    print(
        f"{'spec':<28} {'DP':>5} {'phase':<7} {'items':>6} {'before':>7} {'sample-LPT':>10} "
        f"{'planner':>8} {'/LB':>7} {'/OPT':>7} {'moved':>6} {'kept':<11} {'plan ms':>8}"
    )
    for row in rows:
        first = True
        for phase, e in row["phases"].items():
            opt = f"{e['ratio_opt']:.4f}" if e["ratio_opt"] else "-"
            plan = f"{row['plan_ms']:.1f}" if first else ""
            print(
                f"{row['spec']:<28} {row['dp']:>5} {phase:<7} {e['items']:>6} {e['before']:>7.3f} "
                f"{e['sample_lpt']:>10.4f} {e['after']:>8.4f} {e['ratio_lb']:>7.4f} {opt:>7} "
                f"{e['moved']:>6.3f} {e['algorithm']:<11} {plan:>8}"
            )
            first = False
    summary = {}
    for dp in args.dp:
        at = [r for r in rows if r["dp"] == dp]
        summary[f"plan_ms_dp{dp}_max"] = max(r["plan_ms"] for r in at)
    ratios = [e["ratio_lb"] for r in rows for e in r["phases"].values()]
    opts = [e["ratio_opt"] for r in rows for e in r["phases"].values() if e["ratio_opt"]]
    summary["worst_ratio_to_lower_bound"] = max(ratios)
    summary["worst_ratio_to_ilp_optimum"] = max(opts) if opts else float("nan")
    summary["ilp_optima_proven"] = len(opts)
    summary["gather_ms_dp%d_max" % max(args.dp)] = max(
        r["gather_ms"] for r in rows if r["dp"] == max(args.dp)
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    for key in sorted(summary, key=lambda k: k == f"plan_ms_dp{max(args.dp)}_max"):
        value = summary[key]
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
