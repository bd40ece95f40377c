#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Is training faster with ``--post-balance auto``? none and auto interleaved on the same data.

Runs the main job (gloo ranks, PP=1) as ``none auto none auto ...`` (``--reps`` pairs) on the
same global batches: upstream Megatron's assignment (``--post-balance none``) and OrchWeave's
per-phase balancing (``--post-balance auto``). The host's speed drifts within minutes, so each
pair's ratio (none's median iteration time over auto's) compares two runs a few seconds apart,
and the median of the pairs is the figure. Beside it, the *ideal* ratio from the metadata alone:
per iteration, Megatron's step is set by the slowest rank's summed work over all phases,
``max_r sum_p c[r, p]``; the balanced step runs each phase to completion everywhere before the
next, ``sum_p max_r c'[r, p]``, with the plan's assignment ``c'``; costs are the balancer's
(FLOPs, or seconds with ``--calibration``). Then the timers' breakdown of the median pair: per
phase, the slowest rank's compute in both modes (what balancing saved), and explain_step's
terms (what it cost: planning, exchanges, waits). Both modes' losses must agree.

``auto`` runs as the product does, under the post-balance guard
(``orchestration.measured_guard``): a probe of 24 iterations from iteration 9 measures the
balanced step against Megatron's inside the run and keeps balancing only where it measured at
least 1% faster. The timed iterations follow the probe's decision (iteration 34 on), so the
figure is what a user's run gets after it; each pair's line says what the guard measured and
chose. ``-- --post-balance-guard-interval 0`` balances every iteration instead.

Usage: python tools/bench/post_balance_cpu.py [--workload W] [--reps R] [--dp 2] [--iters N]
       [--warmup K] [--calibration FILE] [-- extra trainer flags]

Ends with one line ``post_balance_realized_fraction: F``, F = (median ratio - 1) / (ideal - 1).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np
from cpu_runs import run_main_job

from megatron.mllm.cli.args import quiet_config_files
from megatron.mllm.explain import format_comparison, measured_phases, summarize_pair
from orchestration.calibration import Calibration
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata
from orchestration.packing import microbatch_indices
from orchestration.phase_plan import plan_iteration
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

MEGATRON = ["--pipeline-model-parallel-size", "1", "--pipeline-schedule", "megatron"]
TIMED = ["--timing-log-level", "2", "--step-prediction"]
MODES = {"none": ["--post-balance", "none"], "auto": ["--post-balance", "auto"]}


def megatron_rank_samples(gen, iteration: int, dp: int, mbs: int, num_mb: int):
    """Every DP rank's (stream index, metadata), as Megatron's sampler hands them out."""
    return [
        [(k, gen.sample(k)) for mb in microbatch_indices(iteration, r, dp, mbs, num_mb) for k in mb]
        for r in range(dp)
    ]


def ideal_ratio(workload: str, iters: int, dp: int, calibration: str | None,
                extra: list[str]) -> tuple[float, str]:  # fmt: skip
    """Megatron's over the balanced predicted step time, summed over the iterations."""
    config_files = quiet_config_files()
    flags = [*config_files.set_flags({"workload": workload}), *map(shlex.quote, extra)]
    spec = config_files.load_run_config("cpu-main", [" ".join(flags)], world_size=dp).semu
    t = spec.training
    gen = WorkloadGenerator(
        WorkloadSpec.load(workload), seed=t.workload_seed, token_scale=t.workload_token_scale
    )
    cost = CostModel.build(spec.shape, Calibration.load(calibration) if calibration else None)
    mbs = t.micro_batch_size
    num_mb = t.global_batch_size // (mbs * dp)
    before = after = 0.0
    for it in range(iters):
        md = GatheredMetadata.from_rank_samples(megatron_rank_samples(gen, it, dp, mbs, num_mb))
        plan = plan_iteration(md, cost, algorithm="auto", gpus_per_node=dp)
        before += float(np.sum([p.loads_before for p in plan.phases], axis=0).max())
        after += float(sum(p.loads_after.max() for p in plan.phases))
    return before / after, cost.unit


def guard_note(timed: list[dict]) -> str:
    """What the post-balance guard measured and chose for the timed iterations ('' without
    it)."""
    gains = {r["balance_guard_gain"] for r in timed if "balance_guard_gain" in r}
    if not gains:
        return ""
    balanced = sum(r.get("balanced", True) for r in timed)
    gain = ", ".join(f"{g:.3f}" for g in sorted(gains))
    return f"; guard: balancing measured {gain}x, {balanced}/{len(timed)} timed iterations balanced"


def _median_time(records: list[dict]) -> float:
    return statistics.median(r["iteration_time_s"] for r in records)


def phase_table(none: list[dict], auto: list[dict], warmup: int, dp: int) -> list[str]:
    """Per phase, the slowest rank's measured compute (mean over the timed iterations)."""

    def slowest(records: list[dict]) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for rec in records[warmup:]:
            per_rank = [measured_phases(rec["timers"], r) for r in range(dp)]
            for phase in per_rank[0]:
                out.setdefault(phase, []).append(max(p.get(phase, 0.0) for p in per_rank))
        return {p: statistics.mean(v) for p, v in out.items()}

    def ms(x: float | None) -> str:
        return f"{x * 1e3:8.1f}" if x is not None else f"{'-':>8s}"

    a, b = slowest(none), slowest(auto)
    lines = ["per phase, slowest rank's compute, ms per iteration (what balancing saved; '-': "
             "the step does not time that module apart):"]  # fmt: skip
    lines.append(f"    {'phase':10s} {'none':>8s} {'auto':>8s} {'saved':>8s}")
    for phase in dict.fromkeys([*a, *b]):
        pa, pb = a.get(phase), b.get(phase)
        saved = pa - pb if pa is not None and pb is not None else None
        lines.append(f"    {phase:10s} {ms(pa)} {ms(pb)} {ms(saved)}")
    return lines


def exchange_table(none: list[dict], auto: list[dict], warmup: int) -> list[str]:
    """Per mode, per iteration: all-to-alls and their time, and the plan's time on and off the
    critical path."""

    def mean(values) -> float:
        values = list(values)
        return statistics.mean(values) if values else 0.0

    def row(records: list[dict]) -> dict[str, float]:
        timed = records[warmup:]
        t = [r["timers"] for r in timed]
        rank_mean = lambda name, tt: mean(tt["seconds"].get(name, [0.0]))  # noqa: E731
        return {
            "all-to-alls": mean(len(x["detail"].get("all-to-all", {})) for x in t),
            "all-to-all ms": 1e3 * mean(rank_mean("all-to-all", x) for x in t),
            "  of which waits": 1e3
            * mean(mean(x["collectives"].get("all-to-all", {}).get("wait", [0.0])) for x in t),
            "digest collectives": mean("plan-digest" in x["seconds"] for x in t),
            "plan ms, critical path": 1e3
            * mean(rank_mean("plan", x) + rank_mean("plan-wait", x) for x in t),
            "plan ms, background": 1e3 * mean(r.get("plan_background_s", 0.0) for r in timed),
            "phases kept": mean(r.get("decisions", "").count(" kept ") for r in timed),
        }

    a, b = row(none), row(auto)
    lines = ["exchanges and planning, mean per iteration (timed iterations):"]
    lines.append(f"    {'':26s} {'none':>8s} {'auto':>8s}")
    for key in a:
        lines.append(f"    {key:26s} {a[key]:8.2f} {b[key]:8.2f}")
    return lines


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("--reps", type=int, default=3, help="none/auto pairs (at least 3)")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel ranks (gloo processes)")
    # The fitted costs take over after --cost-fit-warmup (8) iterations and the guard's probe
    # decides after iteration 33: the timed ones follow.
    parser.add_argument("--iters", type=int, default=48)
    parser.add_argument("--warmup", type=int, default=36)
    parser.add_argument("--calibration", help="calibration JSON for the ideal ratio's costs")
    args = parser.parse_args(own)
    if args.reps < 3:
        parser.error(f"--reps {args.reps}: a comparison needs at least 3 interleaved pairs")
    if args.calibration:  # the runs start in the repository root
        args.calibration = str(Path(args.calibration).resolve())
    common = [*MEGATRON, *TIMED, "--workload", args.workload, *extra]
    print(f"batch post-balancing on {args.workload}, CPU, DP={args.dp} (PP=1), same global "
          f"batches; {args.reps} pairs none/auto interleaved, {args.iters} iterations each, "
          f"{args.warmup} warm-up" + (f"; extra flags: {shlex.join(extra)}" if extra else ""))  # fmt: skip
    pairs = []
    for rep in range(args.reps):
        runs = {m: run_main_job(f"{m} (pair {rep + 1})", [*common, *flags], args.iters,
                                nproc=args.dp) for m, flags in MODES.items()}  # fmt: skip
        t_none, t_auto = (_median_time(runs[m][args.warmup :]) for m in MODES)
        deviation = max(abs(a["lm_loss"] - b["lm_loss"]) / abs(a["lm_loss"])
                        for a, b in zip(runs["none"], runs["auto"]))  # fmt: skip
        pairs.append((t_none / t_auto, runs))
        print(f"pair {rep + 1}: iteration none {t_none * 1e3:.1f} ms, auto {t_auto * 1e3:.1f} ms: "
              f"ratio {t_none / t_auto:.3f} (largest relative loss difference {deviation:.1e})"
              f"{guard_note(runs['auto'][args.warmup :])}")  # fmt: skip
    ratios = [r for r, _ in pairs]
    median = statistics.median(ratios)
    ideal, unit = ideal_ratio(args.workload, args.iters, args.dp, args.calibration, extra)
    print(f"measured ratio (none / auto iteration time): median {median:.3f}, spread "
          f"{min(ratios):.3f}-{max(ratios):.3f}")  # fmt: skip
    print(f"ideal ratio from the metadata ({unit} costs): {ideal:.3f}")
    _, runs = sorted(pairs, key=lambda p: p[0])[len(pairs) // 2]
    print("-- timers of the median pair")
    print("\n".join(phase_table(runs["none"], runs["auto"], args.warmup, args.dp)))
    a, b = summarize_pair(runs["none"], runs["auto"], args.warmup)
    a.name, b.name = "none", "auto"
    print("\n".join(format_comparison(a, b)))
    print("\n".join(exchange_table(runs["none"], runs["auto"], args.warmup)))
    bytes_moved = statistics.mean(r.get("bytes_moved", 0.0) for r in runs["auto"])
    print(f"bytes moved per iteration (auto): {bytes_moved / 1e6:.3f} MB")
    fraction = (median - 1.0) / (ideal - 1.0) if ideal > 1.0 else float("nan")
    print(f"post_balance_realized_fraction: {fraction:.3f}")


if __name__ == "__main__":
    main()
