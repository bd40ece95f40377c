#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Quality and time of phase 1 of the schedule search (MCTS over segment priorities), in SEMU.

For each case (vlm-s on h800-16, t2v-s on h800-16, omni-84b on h100-2560, the CPU main job
at PP=2 on cpu-2ranks with the shipped CPU calibration, and the CPU main job with 4
microbatches, small enough to enumerate), over ``--batches`` iterations of the workload (one
DP replica, as ``build_step(replicas=1)``; the trainer's microbatches, unpadded as the
runtime runs them), on the dynamic pipeline's interleaved placement:

* ``greedy``: phase 2 with its default priority (SEMU's compute times as durations; the
  ``flops`` column is the trainer's order today, FLOP durations);
* ``mcts@B``: the search with B rollouts beyond greedy, for the three ``--budgets`` (one run
  at the largest budget: with a rollout budget the search is deterministic, so its first B
  rollouts are exactly a run with budget B; the search time of B is when its B-th rollout
  ended);
* ``random``: the best of N random orders (N = the largest budget, same generator seed);
* ``worst``: the slowest order the search finds when maximising (the middle budget);
* ``exact``: the optimum over every order (:func:`exhaustive_best`) for cases of at most
  ``--exact-max-groups`` segment groups, when the enumeration finishes within
  ``--exact-runs`` phase-2 runs (``k/n``: it finished on k of n batches; ``-``: never).

Times are SEMU's pipeline makespan (ms), medians over the batches; ``x`` columns are greedy
over the column. ``ms/rollout`` is the search's wall time over its rollouts (phase 2 with its
lowering, then SEMU, per order; with ``--workers N`` the N processes score each wave of the
search together, and the figure is the wall time per rollout of the whole search, the
start-up of the workers excluded). No wall-clock training is run.

Usage: python tools/bench/search_quality.py [--batches 10] [--budgets 4 16 48] [--quick]
       [--cases vlm-s t2v-s omni-84b cpu-main cpu-main-2mb] [--seed 0] [--json FILE]
       [--workers 1] [--max-workers N]

Ends with ``mcts_over_greedy_speedup: X``: the median over batches and cases of greedy's time
over the search's at the largest budget.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from megatron.mllm.cli.args import quiet_config_files
from megatron.mllm.cli.progress import add_no_progress_flag, echo, progress


@dataclass(frozen=True)
class Case:
    """One model on one cluster."""

    name: str
    """Row label."""

    model: str
    """Model config (scripts/configs)."""

    cluster: str
    """Cluster config."""

    sets: dict = field(default_factory=dict)
    """Flag overrides (as ``tools/semu.py --set``)."""

    calibration: str | None = None
    """Calibration file (None: SEMU's analytical costs)."""


CPU_CAL = "scripts/configs/calibration-cpu.json"
CASES = {
    "vlm-s": Case("vlm-s", "vlm-s", "h800-16"),
    "t2v-s": Case("t2v-s", "t2v-s", "h800-16"),
    "omni-84b": Case("omni-84b", "omni-84b", "h100-2560"),
    "cpu-main": Case(
        "cpu-main", "cpu-main", "cpu-2ranks", {"pipeline-model-parallel-size": 2}, CPU_CAL
    ),
    "cpu-main-2mb": Case(
        "cpu-main-2mb",
        "cpu-main",
        "cpu-2ranks",
        {"pipeline-model-parallel-size": 2, "global-batch-size": 4},
        CPU_CAL,
    ),
}


def bench_case(
    case: Case,
    batches: int,
    budgets: list[int],
    seed: int,
    exact_runs: int,
    exact_max_groups: int,
    pool=None,
) -> dict:
    """Every figure of one case, per batch (``pool``: a SearchPool scoring the search's waves,
    None: one worker, this process)."""
    configs = quiet_config_files()
    from orchestration.calibration import Calibration
    from pipeweaver.search.exhaustive import exhaustive_best
    from pipeweaver.search.mcts import OrderEvaluator, tree_search
    from pipeweaver.search.search_pool import cached_many
    from pipeweaver.semu.hardware import ClusterSpec
    from pipeweaver.semu.scenario import build_step
    from pipeweaver.semu.simulator import Semu

    cluster = ClusterSpec.load(configs.find_config(case.cluster))
    spec = configs.load_run_config(
        case.model, configs.set_flags(case.sets), world_size=cluster.num_devices
    ).semu
    semu = Semu(spec, cluster, Calibration.load(case.calibration) if case.calibration else None)
    rows = []
    for it in progress(range(batches), case.name, leave=False):
        scheds, mbs, info = build_step(
            spec,
            cluster,
            schedule="dynamic",
            pad=False,
            replicas=1,
            iteration=it,
            run_checker=False,
        )
        sched, mbs = scheds[0], mbs[0]
        ev = OrderEvaluator(sched.placement, sched.structure, mbs, semu)
        space = ev.space
        trace: list[tuple[float, float]] = []
        t0 = time.perf_counter()

        def traced(order):
            t = ev(order)
            trace.append((time.perf_counter() - t0, t))
            return t

        workers, traced_many = 1, None
        if pool is not None:
            pool.load(ev)
            workers, many = pool.workers, functools.partial(cached_many, ev._cache, pool.evaluate)

            def traced_many(orders):  # a wave's orders end together
                times = many(orders)
                trace.extend((time.perf_counter() - t0, t) for t in times)
                return times

            t0 = time.perf_counter()  # the scorer's loading is start-up, not search
        tree_search(
            space,
            traced,
            rollouts=max(budgets),
            seed=seed,
            workers=workers,
            evaluate_many=traced_many,
        )
        row = {
            "iteration": it,
            "groups": len(space),
            "microbatches": info["num_microbatches"],
            "flops": semu.simulate_pipeline(sched, mbs, record_events=False).makespan,
            "greedy": trace[0][1],
            "mcts": {},
            "mcts_s": {},
        }
        for b in budgets:
            row["mcts"][b] = min(t for _, t in trace[: b + 1])
            row["mcts_s"][b] = trace[min(b, len(trace) - 1)][0]
        n_eval = ev.evaluations
        row["ms_per_rollout"] = 1e3 * trace[-1][0] / len(trace)
        rng = np.random.default_rng(seed)
        nf, n = space.num_forward, len(space)
        best_random = np.inf
        for _ in range(max(budgets)):
            order = space.merge(
                [int(i) for i in rng.permutation(nf)],
                [int(i) + nf for i in rng.permutation(n - nf)],
            )
            best_random = min(best_random, ev(order))
        row["random"] = best_random
        worst = tree_search(
            space,
            ev,
            rollouts=sorted(budgets)[len(budgets) // 2],
            seed=seed,
            maximize=True,
            workers=workers,
            evaluate_many=None if pool is None else many,
        )
        row["worst"] = worst.time_s
        row["exact"] = None
        if len(space) <= exact_max_groups:
            try:
                row["exact"] = exhaustive_best(ev, max_runs=exact_runs).step_time_s
            except RuntimeError:
                pass  # too many classes to enumerate
        row["distinct_orders"] = n_eval
        rows.append(row)
        echo(
            f"... {case.name} batch {it}: greedy {row['greedy'] * 1e3:.2f} ms, "
            f"mcts@{max(budgets)} {row['mcts'][max(budgets)] * 1e3:.2f} ms",
            file=sys.stderr,
        )
    return {"case": case.name, "rows": rows}


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=10, help="iterations per case")
    ap.add_argument("--budgets", type=int, nargs=3, default=[4, 16, 48], help="rollouts")
    ap.add_argument("--quick", action="store_true", help="3 batches, budgets 4 8 16")
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exact-runs", type=int, default=1500, help="cap of the enumeration")
    ap.add_argument(
        "--exact-max-groups", type=int, default=24, help="enumerate only up to this many groups"
    )
    ap.add_argument("--json", help="also write every number to this JSON file")
    ap.add_argument(
        "--workers", type=int, default=1, help="search processes (1: this one; see --max-workers)"
    )
    ap.add_argument(
        "--max-workers",
        type=int,
        help="cap on --workers (default half the host's cores, as the trainer; raise it only "
        "to measure)",
    )
    add_no_progress_flag(ap)
    args = ap.parse_args()
    if args.quick:
        args.batches, args.budgets = min(args.batches, 3), [4, 8, 16]
    budgets = sorted(args.budgets)
    from pipeweaver.search.search_pool import SearchPool, check_workers

    try:
        check_workers(args.workers, args.max_workers, "--workers")
    except ValueError as e:
        ap.error(str(e))
    pool = None
    if args.workers > 1:
        pool = SearchPool(args.workers, max_workers=args.max_workers)
    try:
        results = [
            bench_case(
                CASES[c],
                args.batches,
                budgets,
                args.seed,
                args.exact_runs,
                args.exact_max_groups,
                pool,
            )
            for c in args.cases
        ]
    finally:
        if pool is not None:
            pool.close()
    print(
        f"phase-1 search quality in SEMU: pipeline makespan (ms), median over {args.batches} "
        f"batches; xG = greedy / column; MCTS seed {args.seed}, {args.workers} worker(s)"
    )
    head = f"{'case':<13} {'mb':>3} {'grp':>4} {'flops':>9} {'greedy':>9} "
    head += " ".join(f"{'mcts@' + str(b):>9} {'xG':>5}" for b in budgets)
    head += f" {'random':>9} {'xG':>5} {'worst':>9} {'exact':>9} {'search s':>8} {'ms/roll':>7}"
    print(head)
    speedups = []
    for res in results:
        rows = res["rows"]
        med = lambda key: _median([r[key] for r in rows])  # noqa: E731
        line = (
            f"{res['case']:<13} {rows[0]['microbatches']:>3} {rows[0]['groups']:>4} "
            f"{med('flops') * 1e3:>9.2f} {med('greedy') * 1e3:>9.2f} "
        )
        for b in budgets:
            t = _median([r["mcts"][b] for r in rows])
            x = _median([r["greedy"] / r["mcts"][b] for r in rows])
            line += f"{t * 1e3:>9.2f} {x:>5.3f} "
        exact = [r["exact"] for r in rows if r["exact"] is not None]
        exact_s = (
            f"{_median(exact) * 1e3:.2f}"
            if len(exact) == len(rows)
            else (f"{len(exact)}/{len(rows)}" if exact else "-")
        )
        line += (
            f"{med('random') * 1e3:>9.2f} "
            f"{_median([r['greedy'] / r['random'] for r in rows]):>5.3f} "
            f"{med('worst') * 1e3:>9.2f} {exact_s:>9} "
            f"{_median([r['mcts_s'][budgets[-1]] for r in rows]):>8.2f} "
            f"{med('ms_per_rollout'):>7.1f}"
        )
        print(line)
        if exact:
            hit = sum(
                1 for r in rows if r["exact"] is not None and r["mcts"][budgets[-1]] <= r["exact"]
            )
            print(
                f"  {res['case']}: mcts@{budgets[-1]} equals the exact optimum on "
                f"{hit}/{len(exact)} batches enumerated"
            )
        speedups += [r["greedy"] / r["mcts"][budgets[-1]] for r in rows]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    print(f"mcts_over_greedy_speedup: {statistics.median(speedups):.4f}")


if __name__ == "__main__":
    main()
