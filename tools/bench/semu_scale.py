#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""How long SEMU takes to simulate one step of the 84B three-modality model on 2,560 H100s.

The cases of issue 13 (``scripts/configs/omni-84b.json`` on ``h100-2560``: TP 8, PP 4, DP 80,
every replica simulated, none copied), both with the trainer's dynamic pipeline (greedy
dual-queue order per replica, ``--pad none``), as ``tools/semu.py --model omni-84b --cluster
h100-2560 --schedule dynamic --pad none [--set global-batch-size=10240]`` runs them:

* ``dynamic, 16 microbatches``: the config's global batch (1,280);
* ``dynamic, 128 microbatches``: global batch 10,240.

Each case is timed as three parts, on one thread, the minimum of ``--repeats`` (the host is
shared): ``schedules`` (drawing the samples, packing, the greedy order and its lowering, per
replica), ``checker`` (:func:`pipeweaver.checker.check` on each replica's schedule as it is
made, as ``tools/semu.py`` checks them) and ``simulation`` (:meth:`Semu.simulate_step`, fresh
caches); ``step`` is the minimum of the whole. Every repeat starts cold, as a ``tools/semu.py``
process does: the data flows kept between steps (:func:`pipeweaver.dataflow.clear_flow_caches`)
are forgotten first. The config is parsed once, outside the
timings. Ends with ``semu_dynamic_dp80_m128_s: X`` (the whole step of the second case, in
seconds).
"""

from __future__ import annotations

import argparse
import time

from megatron.mllm.config_files import find_config, load_run_config, set_flags
from pipeweaver.checker import check
from pipeweaver.dataflow import clear_flow_caches
from pipeweaver.semu import scenario
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.simulator import Semu

CASES = {"dynamic, 16 microbatches": 1280, "dynamic, 128 microbatches": 10240}
"""Case name -> global batch size (DP 80, micro batch 1)."""


def _time_case(spec, cluster, repeats: int) -> dict[str, float]:
    """Minimum over ``repeats`` of each part's seconds (each part's own minimum), and of the
    whole step's."""
    best = dict.fromkeys(("schedules", "checker", "simulation", "step"), float("inf"))
    checking = [0.0]

    def timed_check(schedule, **kwargs):
        t = time.perf_counter()
        try:
            return check(schedule, **kwargs)
        finally:
            checking[0] += time.perf_counter() - t

    for _ in range(repeats):
        clear_flow_caches()
        checking[0] = 0.0
        scenario.check = timed_check  # as tools/semu.py runs it: each schedule checked when made
        try:
            t0 = time.perf_counter()
            schedules, mbs, _ = scenario.build_step(spec, cluster, schedule="dynamic", pad=False)
            t1 = time.perf_counter()
        finally:
            scenario.check = check
        Semu(spec, cluster).simulate_step(schedules, mbs)
        t2 = time.perf_counter()
        parts = (t1 - t0 - checking[0], checking[0], t2 - t1, t2 - t0)
        for part, seconds in zip(best, parts):
            best[part] = min(best[part], seconds)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cluster = ClusterSpec.load(find_config("h100-2560"))
    print(
        f"SEMU at scale: omni-84b on {cluster.name} ({cluster.num_devices} devices), "
        f"--schedule dynamic --pad none, min of {args.repeats}, seconds"
    )
    print(f"{'case':<28}{'schedules':>11}{'checker':>10}{'simulation':>12}{'step':>9}")
    results = {}
    for name, gbs in CASES.items():
        spec = load_run_config(
            "omni-84b", set_flags({"global-batch-size": gbs}), world_size=cluster.num_devices
        ).semu
        r = results[name] = _time_case(spec, cluster, args.repeats)
        print(
            f"{name:<28}{r['schedules']:>11.3f}{r['checker']:>10.3f}{r['simulation']:>12.3f}"
            f"{r['step']:>9.3f}"
        )
    print(f"semu_dynamic_dp80_m16_s: {results['dynamic, 16 microbatches']['step']:.3f}")
    print(f"semu_dynamic_dp80_m128_s: {results['dynamic, 128 microbatches']['step']:.3f}")


if __name__ == "__main__":
    main()
