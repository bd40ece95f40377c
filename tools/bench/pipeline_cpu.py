#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dynamic interleaved pipeline on a real CPU run: PP=2, every schedule interleaved.

Runs the main job at PP=2 (2 gloo ranks) on the same data, round after round, each round
running every variant once in turn (``megatron 1f1b greedy searched megatron 1f1b ...``), so
that the host's drift hits all variants alike:

- ``megatron``: megatron-core's 1F1B, encoders on stage 0, microbatches padded to a fixed shape;
- ``1f1b``: the same order and placement in OrchWeave's runtime, without padding;
- ``greedy``: every module cut over both stages, greedy dual-queue order per batch
  (``--pipeline-schedule dynamic --schedule-search-budget-ms 0``);
- ``searched``: the same with the schedule search (MCTS over segment priorities, one batch
  ahead) on every batch, forced on with a 200 ms budget (by default it is off on a host without
  a spare core, such as this 2-core one) and its guard off;
- ``1f1b-send``, ``greedy-send`` (not run by default): ``1f1b`` and ``greedy`` with the
  runtime's receives posted each ahead of its send (``--pipeline-receive-posting send``,
  NCCL's default) instead of all at the step's start (gloo's);
- ``guarded``: the same with the guard as a run has it by default
  (``orchestration.measured_guard``): a probe of 24 iterations from iteration 9 measures the
  search against greedy and keeps whichever is faster, so the default ``--warmup`` (32) times
  only what comes after the decision.

and, in each round, a **crossover pair** of the search against greedy: two runs of
``--schedule-search-alternate B`` (the searched order and greedy's, nothing searched, in
alternate blocks of B iterations for the whole run), the first run searched first, the second
greedy first, so every batch runs once each way and every ratio compares iterations seconds
apart in one process (separate runs, seconds to minutes apart, differ by the host's drift:
10-30% here). A run's ratio is the median time of its greedy iterations over that of its
searched ones, every block's first and last iteration left out (the first runs the order
planned in the block before; the last searched one searches the next block's first batch); a
pair's is the geometric mean of its two runs'.

With ``--memory-limit`` two more variants run under a memory limit of that fraction of
greedy's peak activation memory (SEMU's, in the run's calibration): ``recompute`` (greedy with
every chunk recomputed, ``--pipeline-recompute all``), ``limited`` (the search with the
limit, the memory ILP choosing what to recompute) and ``limited-guarded`` (the same under the
search guard: after its probe, the ILP alone on greedy's order where the search does not pay).

Per round it prints each variant's median iteration time and its ratio to ``greedy``; then the
median ratio and spread per variant over the rounds, and SEMU's predicted ratio for the same
iterations beside it. The runs' losses must agree. Before the rounds the calibration's layer
tables are re-measured on the host of the moment (``tools/calibrate.py --stages layers --base``,
about a minute; ``--no-refresh-layers``: the file as it is): this shared host's speed drifts by
10-30% within hours, and every run scores with the refreshed file.

Usage: python tools/bench/pipeline_cpu.py [--workload W] [--rounds R] [--iters N] [--warmup K]
       [--calibration FILE|none] [--no-refresh-layers] [--memory-limit F] [-- trainer flags]

Ends with one line ``searched_over_greedy_measured: X`` (the median over the rounds of the
crossover pairs' ratios; without the crossover, ``--variants`` without ``crossover``, of greedy's
iteration time over searched's in separate runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

from cpu_runs import (
    median_iteration_ms,
    predicted_step_ms,
    refresh_layers,
    run_main_job,
    split_trainer_flags,
)

from megatron.mllm.cli.progress import progress
from megatron.mllm.config_files import CONFIG_DIR, find_config, load_run_config, set_flags
from orchestration.calibration import Calibration
from pipeweaver.search.memory_limit import headroom_limit_gb
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

SOURCES = ("searched", "missed", "in-step", "guard", "greedy")

COMMON = ["--pipeline-model-parallel-size", "2", "--post-balance", "none"]
VARIANTS = {
    "megatron": ["--pipeline-schedule", "megatron"],
    # Megatron-LM's packed sequences (--pack-sequences): each pipeline's samples first-fit
    # decreasing into fixed-length sequences, fewer microbatches padded far less: the strong
    # baseline on short samples; and the runtime's greedy order on the same packed microbatches.
    "megatron-packed": ["--pipeline-schedule", "megatron", "--pack-sequences"],
    "greedy-packed": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0",
                      "--pack-sequences"],  # fmt: skip
    "1f1b": ["--pipeline-schedule", "1f1b"],
    "greedy": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0"],
    # The runtime's receives posted each ahead of its send (NCCL's default) instead of all at
    # the step's start (gloo's): what posting them early is worth on this host.
    "1f1b-send": ["--pipeline-schedule", "1f1b", "--pipeline-receive-posting", "send"],
    "greedy-send": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0",
                    "--pipeline-receive-posting", "send"],  # fmt: skip
    # Forced: by default the search is off on a host without a spare core, as here.
    "searched": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "200",
                 "--schedule-search-guard-interval", "0"],  # fmt: skip
    "guarded": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "200"],
    # The search in the step: its time is the timers' `schedule`, so the step minus it is what
    # the searched schedule costs to run (what a host with a spare core would pay).
    "in-step": ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "200",
                "--no-plan-ahead", "--schedule-search-guard-interval", "0"],  # fmt: skip
}
SHIPPED_CALIBRATION = str(CONFIG_DIR / "calibration-cpu.json")
"""The CPU calibration as shipped."""

DEFAULT_VARIANTS = ("megatron", "1f1b", "greedy", "searched", "guarded", "crossover")

CROSSOVER = ["--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "200"]
"""The crossover's runs (with ``--schedule-search-alternate B``, which replaces the guard)."""

SEARCHED_SOURCES = ("searched", "missed", "in-step")
"""The schedule sources of an iteration in the search's arm (``missed``: its search was late
and greedy ran; the arm pays for the search all the same); ``guard``: greedy's arm."""


def crossover_arms(records: list[dict], block: int, first: str, warmup: int) -> dict[str, list]:
    """A crossover run's timed iterations by arm (``searched``, ``greedy``), from the
    alternation's pattern, every block's first and last iteration left out.

    Raises:
        SystemExit: an iteration's schedule source disagrees with its arm.
    """
    arms: dict[str, list[dict]] = {"searched": [], "greedy": []}
    for record in records:
        i = record["iteration"] - 1  # the alternation's clock: 0 for the run's first step
        position = i % block
        if i < warmup or position in (0, block - 1):
            continue
        searched = ((i // block) % 2 == 0) == (first == "searched")
        source = record.get("schedule_search", {}).get("source")
        if (source in SEARCHED_SOURCES) != searched:
            sys.exit(f"error: iteration {i + 1} ran a {source} schedule in the "
                     f"{'searched' if searched else 'greedy'} arm of the alternation")  # fmt: skip
        arms["searched" if searched else "greedy"].append(record)
    if not arms["searched"] or not arms["greedy"]:
        sys.exit("error: a crossover run did not alternate: more --crossover-iters")
    return arms


def crossover_ratio(runs: list[dict[str, list]], key) -> float:
    """The geometric mean over a pair's runs of median(greedy) / median(searched) of ``key``."""
    product = 1.0
    for arms in runs:
        product *= statistics.median(map(key, arms["greedy"])) / statistics.median(
            map(key, arms["searched"])
        )
    return product ** (1.0 / len(runs))


def _run_ms(records: list[dict], warmup: int) -> float:
    """Median iteration time minus the step's scheduling (the timers' ``schedule``, slowest
    rank): the time the schedule itself took to run."""
    return 1000 * statistics.median(
        r["iteration_time_s"] - max(r.get("timers", {}).get("seconds", {}).get("schedule", [0.0]))
        for r in records[warmup:]
    )


def memory_limit_gb(fraction: float, workload: str, iters: int, calibration: str | None) -> float:
    """``--pipeline-memory-limit-gb`` that leaves ``fraction`` of greedy's peak activation
    memory (SEMU's, over the iterations, the busiest stage) above the static bytes."""
    cluster = ClusterSpec.load(find_config("cpu-2ranks"))
    flags = set_flags({"pipeline-model-parallel-size": 2, "workload": workload})
    spec = load_run_config("cpu-main", flags, world_size=cluster.num_devices).semu
    semu = Semu(spec, cluster, Calibration.load(calibration) if calibration else None)
    limit = 0.0
    for it in range(iters):  # the static bytes are the same every iteration: the peak decides
        schedules, mbs, _ = build_step(spec, cluster, schedule="dynamic", pad=False, iteration=it)
        step = semu.simulate_step(schedules, mbs, record_events=False)
        limit = max(
            limit, headroom_limit_gb(fraction, step.static_bytes, step.peak_activation_bytes)
        )
    return limit


def main() -> None:
    argv, extra = split_trainer_flags(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", default="omni-three-modality")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=32, help="untimed iterations (the guard's "
                        "probe ends at iteration 32)")  # fmt: skip
    parser.add_argument(
        "--calibration",
        default=SHIPPED_CALIBRATION,
        help=f"calibration JSON (tools/calibrate.py) for SEMU and the search (default "
        f"{SHIPPED_CALIBRATION}; 'none': SEMU's CPU placeholders, which predict a quarter of "
        "this host's step times)",
    )
    parser.add_argument(
        "--refresh-layers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-measure the calibration's layer tables on this host before the rounds "
        "(tools/calibrate.py --stages layers --base, about a minute; default on)",
    )
    parser.add_argument(
        "--memory-limit",
        type=float,
        help="also run under this fraction of greedy's peak activation memory (e.g. 0.6)",
    )
    parser.add_argument("--variants", nargs="*", default=None, help="subset to run")
    parser.add_argument("--block", type=int, default=5, help="crossover: iterations per block")
    parser.add_argument("--crossover-iters", type=int, default=80, help="crossover: per run")
    parser.add_argument("--crossover-warmup", type=int, default=16, help="crossover: untimed")
    args = parser.parse_args(argv)
    if args.calibration == "none":
        args.calibration = None
    # Every run scores its schedules with the same calibration: the host probe rescales a
    # calibration by the host's speed at each run's start-up, which drifts with the load, and
    # would make the runs' SEMU ratios compare different calibrations.
    os.environ.setdefault("ORCHWEAVE_CALIBRATION_PROBE", "0")
    if args.rounds < 3:
        sys.exit("error: --rounds must be >= 3 (one round says nothing on a drifting host)")
    if args.calibration and args.refresh_layers:
        workdir = tempfile.TemporaryDirectory()  # lives until the benchmark exits
        shipped, args.calibration = args.calibration, refresh_layers(args.calibration, workdir.name)
        print(f"calibration: {shipped} with its layer tables re-measured now "
              f"(tools/calibrate.py --stages layers --base {shipped})")  # fmt: skip
    common = [*COMMON, "--workload", args.workload, *extra]
    common += ["--timing-log-level", "1", "--step-prediction"]
    if args.calibration:
        common += ["--cost-calibration", args.calibration]
    wanted = args.variants or DEFAULT_VARIANTS
    variants = {k: v for k, v in VARIANTS.items() if k in wanted}
    pairs: list[tuple[float, float | None]] = []  # measured, SEMU: one per round
    late = [0, 0]  # the crossover's searched iterations whose search was late, and all
    if args.memory_limit:
        variants["recompute"] = [*VARIANTS["greedy"], "--pipeline-recompute", "all"]
        limit = memory_limit_gb(args.memory_limit, args.workload, args.iters, args.calibration)
        print(f"memory limit: {limit:.5f} GiB per stage ({args.memory_limit:g} of greedy's peak "
              f"activations above the static bytes, SEMU)")  # fmt: skip
        variants["limited"] = [*VARIANTS["searched"], "--pipeline-memory-limit-gb", f"{limit:.6f}"]
        variants["limited-guarded"] = [*VARIANTS["guarded"], "--pipeline-memory-limit-gb",
                                       f"{limit:.6f}"]  # fmt: skip
    if "greedy" not in variants:
        sys.exit("error: --variants must include greedy (the reference of the ratios)")
    times: dict[str, list[float]] = {k: [] for k in variants}
    run_ms: dict[str, list[float]] = {k: [] for k in variants}
    searches: dict[str, list[dict]] = {k: [] for k in variants}
    predicted: dict[str, list[float]] = {k: [] for k in variants}
    losses: dict[str, list[float]] = {}
    for r in progress(range(args.rounds), "rounds"):
        for name, flags in variants.items():
            records = run_main_job(name, [*common, *flags], args.iters)
            times[name].append(median_iteration_ms(records, args.warmup))
            run_ms[name].append(_run_ms(records, args.warmup))
            p = predicted_step_ms(records, args.warmup)
            if p is not None:
                predicted[name].append(p)
            losses[name] = [x["lm_loss"] for x in records]
            searches[name] += [x["schedule_search"] for x in records[args.warmup :]
                               if x.get("schedule_search")]  # fmt: skip
        row = " ".join(
            f"{k} {times[k][-1]:.1f} ms ({times['greedy'][-1] / times[k][-1]:.3f})"
            for k in variants
        )
        if "crossover" in wanted:
            split = []
            for first in ("searched", "greedy"):
                flags = [*CROSSOVER, "--schedule-search-alternate", str(args.block),
                         "--schedule-search-alternate-first", first]  # fmt: skip
                records = run_main_job(f"crossover-{first}", [*common, *flags],
                                       args.crossover_iters)  # fmt: skip
                split.append(crossover_arms(records, args.block, first, args.crossover_warmup))
                losses[f"crossover-{first}"] = [x["lm_loss"] for x in records]
            measured = crossover_ratio(split, lambda x: x["iteration_time_s"])
            semu = None
            if all(x.get("prediction") for arms in split for arm in arms.values() for x in arm):
                semu = crossover_ratio(split, lambda x: x["prediction"]["step_s"])
            pairs.append((measured, semu))
            for arms in split:
                late[0] += sum(x["schedule_search"]["source"] == "missed" for x in arms["searched"])
                late[1] += len(arms["searched"])
            row += f" crossover searched/greedy {measured:.3f}"
        print(f"round {r + 1}: {row}", flush=True)
    print(
        f"\nPP=2 on {args.workload}, CPU, 2 gloo ranks, {args.rounds} interleaved rounds of "
        f"{args.iters} iterations ({args.warmup} warm-up); ratio = greedy's time / variant's"
    )
    print(f"{'variant':10s} {'median ms':>10s} {'ratio med':>10s} {'min':>7s} {'max':>7s} "
          f"{'SEMU ratio':>11s} {'run ms':>8s} {'run ratio':>10s}")  # fmt: skip
    summary = {}
    for name in variants:
        ratios = [g / t for g, t in zip(times["greedy"], times[name])]
        semu = "-"
        if predicted[name] and predicted["greedy"]:
            semu = (
                f"{statistics.median(predicted['greedy']) / statistics.median(predicted[name]):.3f}"
            )
        summary[name] = statistics.median(ratios)
        runs = [g / t for g, t in zip(run_ms["greedy"], run_ms[name])]
        print(
            f"{name:10s} {statistics.median(times[name]):10.1f} {summary[name]:10.3f} "
            f"{min(ratios):7.3f} {max(ratios):7.3f} {semu:>11s} "
            f"{statistics.median(run_ms[name]):8.1f} {statistics.median(runs):10.3f}"
        )
    # Runs of one length share the learning-rate schedule: each is compared with the first.
    deviation = 0.0
    for length in {len(seq) for seq in losses.values()}:
        same = [seq for seq in losses.values() if len(seq) == length]
        deviation = max([deviation] + [abs(a - b) / abs(a) for seq in same
                                       for a, b in zip(same[0], seq)])  # fmt: skip
    print(f"largest relative loss difference between the variants: {deviation:.2e}")
    print("run ms: the iteration minus its scheduling (the timers' `schedule`; the search's time "
          "for in-step), the ratio median over the rounds")  # fmt: skip
    for name, found in searches.items():
        if not found:
            continue
        sources = {src: sum(f["source"] == src for f in found) for src in SOURCES}
        hidden = sources["searched"] / len(found)
        print(
            f"{name}: search {1000 * statistics.median(f['search_s'] for f in found):.1f} ms per "
            f"batch (median), {statistics.median(f['rollouts'] for f in found):.0f} rollouts, "
            f"against a step of {statistics.median(times[name]):.1f} ms; hidden (searched ahead "
            f"in time) in {hidden:.0%} of the timed iterations "
            + ", ".join(f"{k} {v}" for k, v in sources.items() if v)
        )
    print(json.dumps({"times_ms": times, "predicted_ms": predicted}), file=sys.stderr)
    for name in ("limited", "limited-guarded"):
        if name in times and "recompute" in times:
            ratios = [r / t for r, t in zip(times["recompute"], times[name])]
            print(f"{name} over recompute (every chunk), measured per round: "
                  + ", ".join(f"{x:.3f}" for x in ratios)
                  + f"; median {statistics.median(ratios):.3f}")  # fmt: skip
    if "guarded" in summary:
        print(f"guarded (the search under its guard) over greedy, measured: "
              f"{summary['guarded']:.3f}")  # fmt: skip
    if pairs:
        measured = [m for m, _ in pairs]
        semu = [p for _, p in pairs if p is not None]
        print(f"crossover (searched against greedy in alternate blocks of {args.block}, "
              f"{args.crossover_iters} iterations per run, {args.crossover_warmup} untimed), per "
              f"round: {', '.join(f'{m:.3f}' for m in measured)}; median "
              f"{statistics.median(measured):.3f} (min {min(measured):.3f}, max "
              f"{max(measured):.3f}); SEMU "
              + (f"{statistics.median(semu):.3f}" if semu else "-")
              + f"; searches late (greedy ran) {late[0]} of {late[1]} timed searched iterations")  # fmt: skip
        print(f"searched_over_greedy_measured: {statistics.median(measured):.3f}")
    elif "searched" in summary:
        print(f"searched_over_greedy_measured: {summary['searched']:.3f}")


if __name__ == "__main__":
    main()
