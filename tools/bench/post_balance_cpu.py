#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Is training faster with ``--post-balance auto``? Balanced and Megatron's step on the same data,
measured as a crossover so that neither the host's drift nor the batches decide the figure.

Each pair is two runs of the main job (gloo ranks, PP=1) on the same global batches, with
``--post-balance auto --post-balance-alternate K``: every run alternates blocks of K iterations
between OrchWeave's per-phase balancing and Megatron's own step (``--post-balance none``'s:
its assignment, nothing planned or moved), the first run balanced first, the second Megatron's
step first. So every batch runs once each way, and every ratio compares iterations seconds
apart in one process. A run's ratio is the median time of its Megatron iterations over that of
its balanced ones; a pair's is the geometric mean of its two runs' (the batches' weights
cancel: each run's arms hold the other run's batches); the median of the pairs is the figure.
Every block's first and last iteration are left out (the first pays for the switch, the last
balanced one plans nothing ahead), and so are the first ``--warmup`` iterations (the fitted
costs take over after 8 balanced ones).

Beside the measured ratio, two ideals:

* **from the metadata** (as the issue defines it): per iteration, Megatron's step is set by
  the slowest rank's summed work over all phases, ``max_r sum_p c[r, p]``; the balanced step
  runs each phase to completion everywhere before the next, ``sum_p max_r c'[r, p]``, with the
  plan's assignment ``c'``; costs are the balancer's (FLOPs, or seconds with
  ``--calibration``). On a CPU the step's time follows FLOPs poorly (per-call overheads), so
  this ideal may be out of any schedule's reach;
* **from the clock**: in Megatron's iterations, each rank waits in the collectives for the
  slowest one; a perfect balance would remove the mean rank's wait:
  ``T / (T - mean_r wait_r)``, summed over the iterations;
* **from the clock, less the host's noise**: not every wait is the data's. Each pair also runs
  the same alternation on a workload in which every rank loads, every iteration, DP rank 0's
  first batch of the tested one (:func:`alike_workload`), so every rank has the same work:
  what Megatron's step still waits there, as a share of its time, is the host's noise, which
  no balance removes. The ideal counts only the waits above that share.

Then the timers' breakdown of the median pair (Megatron's iterations against the balanced
ones of the same batches): per phase, the slowest rank's compute (what balancing saved), and
explain_step's terms (what it cost: planning, exchanges, waits). Both runs' losses must agree.

The product runs ``auto`` under the post-balance guard, which makes this same comparison
inside the run (blocks of 4, 24 iterations) and keeps the faster step; this benchmark measures
the balanced step itself, longer, so that the figure says what balancing buys when it is on.

Usage: python tools/bench/post_balance_cpu.py [--workload W] [--reps R] [--dp 2] [--iters N]
       [--warmup K] [--block K] [--calibration FILE] [-- extra trainer flags]

Ends with one line ``post_balance_realized_fraction: F``, F = (median ratio - 1) / (ideal - 1),
the ideal from the metadata; the line before it gives F against the clock's ideal.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from cpu_runs import run_main_job, split_trainer_flags

from megatron.mllm.cli.args import quiet_config_files
from megatron.mllm.explain import format_comparison, measured_phases, summarize_pair
from orchestration.calibration import Calibration
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata
from orchestration.packing import microbatch_indices
from orchestration.phase_plan import plan_iteration
from orchestration.workload import write_jsonl
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

MEGATRON = ["--pipeline-model-parallel-size", "1", "--pipeline-schedule", "megatron"]
TIMED = ["--timing-log-level", "2", "--step-prediction"]
FIRST = ("balanced", "megatron")
"""The first block's step in the two runs of a pair (``--post-balance-alternate-first``)."""


def megatron_rank_samples(gen, iteration: int, dp: int, mbs: int, num_mb: int):
    """Every DP rank's (stream index, metadata), as Megatron's sampler hands them out."""
    return [
        [(k, gen.sample(k)) for mb in microbatch_indices(iteration, r, dp, mbs, num_mb) for k in mb]
        for r in range(dp)
    ]


def main_job_stream(workload: str, dp: int, extra: list[str]):
    """The main job's model (SEMU's spec, with ``extra`` trainer flags) and its sample stream
    of ``workload``."""
    config_files = quiet_config_files()
    flags = [*config_files.set_flags({"workload": workload}), *map(shlex.quote, extra)]
    spec = config_files.load_run_config("cpu-main", [" ".join(flags)], world_size=dp).semu
    t = spec.training
    gen = WorkloadGenerator(
        WorkloadSpec.load(workload), seed=t.workload_seed, token_scale=t.workload_token_scale
    )
    return spec, gen


def ideal_ratio(workload: str, iters: int, dp: int, calibration: str | None,
                extra: list[str]) -> tuple[float, str]:  # fmt: skip
    """Megatron's over the balanced predicted step time, summed over the iterations."""
    spec, gen = main_job_stream(workload, dp, extra)
    t = spec.training
    cost = CostModel.build(spec.shape, Calibration.load(calibration) if calibration else None)
    mbs = t.micro_batch_size
    num_mb = t.global_batch_size // (mbs * dp)
    before = after = 0.0
    for it in range(iters):
        md = GatheredMetadata.from_rank_samples(megatron_rank_samples(gen, it, dp, mbs, num_mb))
        plan = plan_iteration(md, cost, algorithm="auto", gpus_per_node=dp,
                              min_llm_samples=num_mb)  # fmt: skip
        before += float(np.sum([p.loads_before for p in plan.phases], axis=0).max())
        after += float(sum(p.loads_after.max() for p in plan.phases))
    return before / after, cost.unit


def alike_workload(workload: str, dp: int, extra: list[str], path: Path) -> Path:
    """A JSONL workload (one global batch, cycled) in which every DP rank loads, every
    iteration, the samples DP rank 0 loads in ``workload``'s first iteration: the ranks' work is
    the same, and each rank's batch is a real one (its mix of modalities and lengths)."""
    spec, gen = main_job_stream(workload, dp, extra)
    t = spec.training
    mbs = t.micro_batch_size
    num_mb = t.global_batch_size // (mbs * dp)
    rank0 = microbatch_indices(0, 0, dp, mbs, num_mb)
    alike = [None] * t.global_batch_size
    for r in range(dp):
        for m, indices in enumerate(microbatch_indices(0, r, dp, mbs, num_mb)):
            for j, k in enumerate(indices):
                alike[k] = gen.sample(rank0[m][j])
    with open(path, "w", encoding="utf-8") as f:
        write_jsonl((dataclasses.replace(s, sample_id=f"alike-{k}") for k, s in enumerate(alike)),
                    f)  # fmt: skip
    return path


def _waits(megatron: list[dict]) -> tuple[float, float]:
    """Megatron's iterations' summed time and the mean rank's summed collective waits."""
    total = waited = 0.0
    for rec in megatron:
        waits = [0.0] * len(rec["timers"]["iteration_s"])
        for timing in rec["timers"]["collectives"].values():
            for r, w in enumerate(timing.get("wait", [])):
                waits[r] += w
        total += rec["iteration_time_s"]
        waited += statistics.mean(waits)
    return total, waited


def crossover(records: list[dict], warmup: int) -> dict[bool, list[dict]]:
    """A run's timed iterations by arm (True: balanced), each block's first and last left out
    (a block is a run of iterations with the same ``balanced``)."""
    arms: dict[bool, list[dict]] = {True: [], False: []}
    timed = records[warmup:]
    start = 0
    while start < len(timed):
        end = start
        while end < len(timed) and timed[end]["balanced"] == timed[start]["balanced"]:
            end += 1
        arms[timed[start]["balanced"]].extend(timed[start + 1 : end - 1])
        start = end
    if not arms[True] or not arms[False]:
        sys.exit("error: a run did not alternate its steps: more --iters, or a smaller --block")
    return arms


def _median_time(records: list[dict]) -> float:
    return statistics.median(r["iteration_time_s"] for r in records)


def clock_ideal(megatron: list[dict], noise_share: float = 0.0) -> float:
    """Megatron's iterations' time over what it would be with no rank waiting for another: the
    mean rank's wait in the collectives removed (summed over the iterations), less the
    ``noise_share`` of the time that it waits even when every rank has the same work."""
    total, waited = _waits(megatron)
    return total / (total - max(0.0, waited - noise_share * total))


def phase_table(none: list[dict], auto: list[dict], dp: int) -> list[str]:
    """Per phase, the slowest rank's measured compute (mean over the given iterations)."""

    def slowest(records: list[dict]) -> dict[str, float]:
        out: dict[str, list[float]] = {}
        for rec in records:
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


def exchange_table(none: list[dict], auto: list[dict]) -> list[str]:
    """Per mode, per iteration: all-to-alls and their time, and the plan's time on and off the
    critical path."""

    def mean(values) -> float:
        values = list(values)
        return statistics.mean(values) if values else 0.0

    def row(records: list[dict]) -> dict[str, float]:
        t = [r["timers"] for r in records]
        rank_mean = lambda name, tt: mean(tt["seconds"].get(name, [0.0]))  # noqa: E731
        return {
            "all-to-alls": mean(len(x["detail"].get("all-to-all", {})) for x in t),
            "all-to-all ms": 1e3 * mean(rank_mean("all-to-all", x) for x in t),
            "  of which waits": 1e3
            * mean(mean(x["collectives"].get("all-to-all", {}).get("wait", [0.0])) for x in t),
            "digest collectives": mean("plan-digest" in x["seconds"] for x in t),
            "plan ms, critical path": 1e3
            * mean(rank_mean("plan", x) + rank_mean("plan-wait", x) for x in t),
            "plan ms, background": 1e3 * mean(r.get("plan_background_s", 0.0) for r in records),
            "phases kept": mean(r.get("decisions", "").count(" kept ") for r in records),
        }

    a, b = row(none), row(auto)
    lines = ["exchanges and planning, mean per iteration (timed iterations):"]
    lines.append(f"    {'':26s} {'none':>8s} {'auto':>8s}")
    for key in a:
        lines.append(f"    {key:26s} {a[key]:8.2f} {b[key]:8.2f}")
    return lines


def main() -> None:
    own, extra = split_trainer_flags(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("--reps", type=int, default=3, help="crossover pairs (at least 3)")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel ranks (gloo processes)")
    parser.add_argument("--iters", type=int, default=85, help="iterations per run")
    # The fitted costs take over after --cost-fit-warmup (8) balanced iterations, iteration
    # 18 to 22 when every other block of 5 is balanced.
    parser.add_argument("--warmup", type=int, default=25, help="iterations left out first")
    parser.add_argument("--block", type=int, default=5, help="iterations per alternating block")
    parser.add_argument("--calibration", help="calibration JSON for the metadata ideal's costs")
    args = parser.parse_args(own)
    if args.reps < 3:
        parser.error(f"--reps {args.reps}: a comparison needs at least 3 interleaved pairs")
    if args.block < 3:
        parser.error(f"--block {args.block}: a block's first and last iterations are left out")
    if args.calibration:  # the runs start in the repository root
        args.calibration = str(Path(args.calibration).resolve())
    common = [*MEGATRON, *TIMED, "--workload", args.workload, "--post-balance", "auto",
              "--post-balance-alternate", str(args.block), *extra]  # fmt: skip
    print(f"batch post-balancing on {args.workload}, CPU, DP={args.dp} (PP=1), same global "
          f"batches; {args.reps} crossover pairs, each two runs of {args.iters} iterations "
          f"alternating balanced and Megatron's step in blocks of {args.block} (opposite "
          f"phases), {args.warmup} warm-up" + (f"; extra flags: {shlex.join(extra)}" if extra
                                               else ""))  # fmt: skip
    scratch = tempfile.TemporaryDirectory()
    alike = alike_workload(args.workload, args.dp, extra, Path(scratch.name) / "alike.jsonl")
    floor_flags = [*common, "--workload", str(alike), "--workload-token-scale", "1"]
    pairs, floors = [], []
    for rep in range(args.reps):
        runs = [run_main_job(f"{first}-first (pair {rep + 1})",
                             [*common, "--post-balance-alternate-first", first], args.iters,
                             nproc=args.dp) for first in FIRST]  # fmt: skip
        floor_run = run_main_job(f"alike (pair {rep + 1})", floor_flags, args.iters, args.dp)
        floors.append(_waits(crossover(floor_run, args.warmup)[False]))
        deviation = max(abs(a["lm_loss"] - b["lm_loss"]) / abs(a["lm_loss"])
                        for a, b in zip(*runs))  # fmt: skip
        split = [crossover(r, args.warmup) for r in runs]
        times = [(_median_time(s[False]), _median_time(s[True])) for s in split]
        ratio = math.sqrt(math.prod(m / b for m, b in times))
        megatron = [r for s in split for r in s[False]]
        balanced = [r for s in split for r in s[True]]
        clock = clock_ideal(megatron)
        share = floors[-1][1] / floors[-1][0]
        pairs.append((ratio, clock, megatron, balanced, clock_ideal(megatron, share)))
        runs_text = "; ".join(f"{first} first: Megatron {m * 1e3:.1f} ms, balanced "
                              f"{b * 1e3:.1f} ms ({m / b:.3f})"
                              for first, (m, b) in zip(FIRST, times))  # fmt: skip
        print(f"pair {rep + 1}: {runs_text}; ratio {ratio:.3f}, clock's ideal {clock:.3f}, "
              f"{pairs[-1][4]:.3f} less the noise (Megatron's step waits {100 * share:.1f}% of "
              f"its time with every sample alike) (largest relative loss difference "
              f"{deviation:.1e})")  # fmt: skip
    ratios = [p[0] for p in pairs]
    median = statistics.median(ratios)
    ideal, unit = ideal_ratio(args.workload, args.iters, args.dp, args.calibration, extra)
    clock = statistics.median(p[1] for p in pairs)
    reachable = statistics.median(p[4] for p in pairs)
    floor_pct = statistics.median(w / t for t, w in floors) * 1e2
    print(f"measured ratio (Megatron's / balanced iteration time): median {median:.3f}, spread "
          f"{min(ratios):.3f}-{max(ratios):.3f}")  # fmt: skip
    print(f"ideal ratio from the metadata ({unit} costs): {ideal:.3f}")
    print(f"ideal ratio from the clock (Megatron's iterations, the mean rank's collective waits "
          f"removed): median {clock:.3f}")  # fmt: skip
    print(f"ideal ratio from the clock less the host's noise (the waits above the {floor_pct:.1f}% "
          f"of its time that Megatron's step waits with every sample alike): median "
          f"{reachable:.3f}")  # fmt: skip
    _, _, megatron, balanced, _ = sorted(pairs, key=lambda p: p[0])[len(pairs) // 2]
    print("-- timers of the median pair (Megatron's iterations, the balanced ones)")
    print("\n".join(phase_table(megatron, balanced, args.dp)))
    a, b = summarize_pair(megatron, balanced, 0)
    a.name, b.name = "none", "auto"
    print("\n".join(format_comparison(a, b)))
    print("\n".join(exchange_table(megatron, balanced)))
    bytes_moved = statistics.mean(r.get("bytes_moved", 0.0) for r in balanced)
    print(f"bytes moved per iteration (auto): {bytes_moved / 1e6:.3f} MB")
    against_clock = (median - 1.0) / (clock - 1.0) if clock > 1.0 else float("nan")
    print(f"realized fraction against the clock's ideal: {against_clock:.3f}")
    if reachable > 1.0:
        print(f"realized fraction against the clock's ideal less the noise: "
              f"{(median - 1.0) / (reachable - 1.0):.3f}")  # fmt: skip
    fraction = (median - 1.0) / (ideal - 1.0) if ideal > 1.0 else float("nan")
    print(f"post_balance_realized_fraction: {fraction:.3f}")


if __name__ == "__main__":
    main()
