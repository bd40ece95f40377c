#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""How fast SEMU simulates one step, with and without spatial-temporal subgraph reuse.

The case of issue 4: PP = 8, 64 microbatches, 3 modules (vision, audio, LLM), one pipeline:
the 84B three-modality model of ``scripts/configs/omni-84b.json`` with PP 8, omni-three-modality
data, vision sub-microbatches of 2 images. Two schedules: Megatron's 1F1B with the encoders on
stage 0, and a dataflow order with every module interleaved over all 8 ranks (DIP's layout, as
the searcher will produce), given compute-only as the searcher hands them to SEMU.

Timings (median of ``--repeats``, wall clock, single thread):

* ``no reuse``: every stage costed from scratch;
* ``cold``: a fresh cache; only the reuse inside the step (equal chunks on different ranks,
  equal shapes in different microbatches) helps;
* ``rollout``: the next search rollout: the same microbatches in a *different* order, with
  the caches warm from earlier rollouts (the searcher's steady state);
* ``repeat``: the same schedule and microbatches again (timeline hit: DP replicas with equal
  batches, re-scored rollouts).

Ends with ``semu_step_ms_pp8_m64: X`` (the rollout time of the dataflow order, in ms).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from megatron.mllm.config_files import load_run_config, set_flags
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec
from pipeweaver.generators import dataflow, one_f_one_b
from pipeweaver.ir import Kind
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import step_microbatches, structure_of
from pipeweaver.semu.hardware import DEVICES, ClusterSpec
from pipeweaver.semu.reuse import ReuseCache
from pipeweaver.semu.simulator import Semu


def _time(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--pp", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rollouts", type=int, default=6, help="distinct orders per schedule")
    args = parser.parse_args()
    pp, m = args.pp, args.microbatches
    cluster = ClusterSpec(DEVICES["h100-sxm"], 8 * pp, name="h100")
    spec = load_run_config(
        "omni-84b",
        set_flags({"pipeline-model-parallel-size": pp, "global-batch-size": m}),
        world_size=cluster.num_devices,
    ).semu
    enc = list(spec.shape.encoders)
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=1)
    mbs = step_microbatches(gen.sample, 0, 1, 1, m, enc, 8192, 8192, sub_tokens=4096)[0]
    structure = structure_of(mbs, enc)
    layers = spec.layers()
    cases = {
        "1f1b, encoders on stage 0": (
            one_f_one_b(Placement.baseline(pp, layers), structure).compute_only(),
            None,
        ),
        "dataflow, all modules interleaved": (None, Placement.interleaved(pp, layers, {})),
    }
    print(
        f"SEMU speed: PP={pp}, {m} microbatches, modules {', '.join(spec.layers())}, "
        f"{sum(mb.num_subs('vision') for mb in mbs)} vision subs, one pipeline, median of "
        f"{args.repeats}"
    )
    print(f"{'schedule':34s} {'actions':>7s} {'no reuse':>9s} {'cold':>9s} {'rollout':>9s} "
          f"{'repeat':>9s} {'speed-up':>9s}  hit rates (rollout)")  # fmt: skip
    result = 0.0
    for name, (fixed, placement) in cases.items():
        # Rollouts: distinct valid orders of the same step (random tie-breaking priorities).
        orders = []
        for k in range(args.rollouts + 1):
            if fixed is not None and k == 0:
                orders.append(fixed)
                continue
            rng = random.Random(k)
            noise = {}
            pl = placement or fixed.placement

            def prio(a, rng=rng, noise=noise):
                if a not in noise:
                    noise[a] = rng.random()
                return (0 if a.kind is Kind.B else 1, a.microbatch + 2 * noise[a])

            orders.append(dataflow(pl, structure, priority=prio).compute_only())
        sched = orders[0]
        n_actions = sum(len(r) for r in sched.actions)

        def no_reuse():
            Semu(spec, cluster, reuse=False).simulate_pipeline(sched, mbs, record_events=False)

        def cold():
            Semu(spec, cluster, cache=ReuseCache()).simulate_pipeline(
                sched, mbs, record_events=False
            )

        cache = ReuseCache()
        warm = Semu(spec, cluster, cache=cache)
        warm.simulate_pipeline(orders[-1], mbs, record_events=False)  # earlier rollouts
        cache.reset_counters()
        it = iter(orders[:-1] * args.repeats)
        t_roll = []
        for _ in range(min(args.repeats, len(orders) - 1)):
            o = next(it)
            t = time.perf_counter()
            warm.simulate_pipeline(o, mbs, record_events=False)
            t_roll.append(time.perf_counter() - t)
        rollout = statistics.median(t_roll)
        rates = {k: v["hit_rate"] for k, v in cache.stats().items()}
        repeat = _time(
            lambda: warm.simulate_pipeline(sched, mbs, record_events=False), args.repeats
        )
        t_no = _time(no_reuse, args.repeats)
        t_cold = _time(cold, args.repeats)
        print(
            f"{name:34s} {n_actions:7d} {t_no * 1e3:8.1f}ms {t_cold * 1e3:8.1f}ms "
            f"{rollout * 1e3:8.1f}ms {repeat * 1e3:8.2f}ms {t_no / rollout:8.1f}x  "
            + " ".join(f"{k} {v:.0%}" for k, v in rates.items() if k != "timeline")
        )
        result = rollout
    print(f"semu_step_ms_pp8_m64: {result * 1e3:.1f}")


if __name__ == "__main__":
    main()
