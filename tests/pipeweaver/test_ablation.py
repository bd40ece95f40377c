# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""DIP's ablation steps on a toy model in SEMU: every step runs, every schedule is valid, and
the memory each step claims to fit is checked against the static checker and SEMU."""

from __future__ import annotations

import functools
import math

import pytest

from megatron.mllm.arguments import ONE_REPLICA
from megatron.mllm.config_files import flag_argv, run_from_flags, set_flags
from pipeweaver.checker import check
from pipeweaver.ir import Kind, Memory
from pipeweaver.search.ablation import (
    DIP_TABLE5_S,
    _with_block_recompute,
    ablation_steps,
    format_table,
    least_fitting,
)
from pipeweaver.search.memory_limit import GIB, memory_limit_bytes
from pipeweaver.search.partition import EncoderLoad, FlopCosts, WorkloadShape, plan_partition
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.simulator import Semu

FLAGS = {
    "num-layers": 4,
    "hidden-size": 64,
    "num-attention-heads": 4,
    "seq-length": 256,
    "max-position-embeddings": 256,
    "vocab-size": 512,
    "vision-num-layers": 4,
    "vision-patch-size": 4,
    "audio-num-layers": 0,
    "workload": "scripts/configs/workloads/dip-vlm-packed.json",
    "workload-token-scale": 0.03125,
    "micro-batch-size": 1,
    "global-batch-size": 4,
    "hidden-dropout": 0,
    "attention-dropout": 0,
    "pipeline-model-parallel-size": 2,
}


@functools.cache
def _setup():
    spec = run_from_flags(flag_argv(set_flags(FLAGS)), ONE_REPLICA).semu
    cluster = ClusterSpec.from_json({"device": "h100-sxm", "num_devices": 2, "devices_per_node": 8})
    # A partition by hand: 2 units per vision sub, one chunk per stage for both modules.
    shape = WorkloadShape({"vision": EncoderLoad(84, 5.0, 8, 3)}, (256,), 4)
    plan = plan_partition(
        spec.layers(), 2, FlopCosts(spec.shape), shape,
        chunks_per_stage={"vision": 1, "llm": 1}, sub_microbatch_units={"vision": 2},
    )  # fmt: skip
    return spec, cluster, plan


def _run(memory_limit_gb=None):
    spec, cluster, plan = _setup()
    semu = Semu(spec, cluster)
    steps = ablation_steps(
        semu, spec, cluster, plan, rollouts=3, seed=0, memory_limit_gb=memory_limit_gb
    )
    return semu, steps


def _recomputed(schedule) -> int:
    return sum(
        a.memory is Memory.RECOMPUTE
        for r in range(schedule.num_ranks)
        for a in schedule.computes(r)
        if a.kind is Kind.F
    )


def test_every_step_runs_and_is_valid_without_pressure():
    semu, steps = _run()
    assert [s.name for s in steps] == [name for name, _, _ in DIP_TABLE5_S]
    for s in steps:
        check(s.schedule)
        assert s.fits and s.step_time_s > 0
        assert _recomputed(s.schedule) == 0  # the toy model fits 80 GB without recompute
    base, part = steps[0].schedule.placement, steps[1].schedule.placement
    # Step 1 runs on the balanced layout (the stages of Placement.balanced_stages), steps 2-5
    # on the partitioner's: vision chunk j and LLM chunk j on rank j.
    assert [len(st) for st in base.stages()] and len(base.stages()) == 2
    assert {m: [cp.rank for cp in cps] for m, cps in part.chunks.items()} == {
        "vision": [0, 1],
        "llm": [0, 1],
    }
    # Step 2 is Megatron's order over the partitioned stages; steps 3-5 share its microbatches.
    assert steps[1].schedule.name == "interleaved"
    assert all(s.schedule.structure == steps[1].schedule.structure for s in steps[2:])
    # The search never loses to its first rollout (greedy), phase 3 never loses to step 4.
    times = [semu.simulate_pipeline(s.schedule, _mbs()).makespan for s in steps[2:]]
    assert times[1] <= times[0] and times[2] <= times[1]
    lines = format_table([steps])
    assert len(lines) == 1 + len(DIP_TABLE5_S) and "Megatron-LM" in lines[1]


def _mbs():
    from pipeweaver.semu.scenario import build_step

    spec, cluster, plan = _setup()
    _, mbs, _ = build_step(
        spec, cluster, schedule="interleaved", placement="interleaved", partition=plan,
        encoder_sub_microbatch_units=dict(plan.sub_microbatch_units), pad=False, replicas=1,
    )  # fmt: skip
    return mbs[0]


def test_a_tight_limit_forces_recompute_and_the_plan_fits_it():
    from pipeweaver.semu.scenario import build_step

    spec, cluster, _ = _setup()
    semu, free = _run()
    none_peak = max(free[0].peak_memory_bytes)
    scheds, mbs, _ = build_step(
        spec, cluster, placement="balanced", memory=Memory.RECOMPUTE, replicas=1
    )
    recompute_peak = max(semu.simulate_step(scheds, mbs).peak_memory_bytes)
    assert recompute_peak < none_peak
    # Megatron's block recompute of n layers per chunk, every n below the deepest chunk's layer
    # count, by brute force.
    deepest = max(c.num_layers for cps in scheds[0].placement.chunks.values() for c in cps)
    block_peaks = {}
    for n in range(1, deepest):
        spec_n = _with_block_recompute(spec, n)
        sch, mb, _ = build_step(spec_n, cluster, placement="balanced", replicas=1)
        block_peaks[n] = max(Semu(spec_n, cluster).simulate_step(sch, mb).peak_memory_bytes)
    assert block_peaks and all(p < none_peak for p in block_peaks.values())
    # A device between the least block recompute's peak and the peak without recompute: the
    # step takes the least recompute that fits (brute force's first n), not every chunk.
    limit_gb = (min(block_peaks.values()) + none_peak) / 2 / GIB
    semu, steps = _run(limit_gb)
    first = min(n for n, p in block_peaks.items() if p <= limit_gb * GIB)
    assert steps[0].memory == f"block recompute of {first} layers per chunk"
    assert _recomputed(steps[0].schedule) == 0  # inside the chunks, not the IR's strategy
    assert max(steps[0].peak_without_recompute_bytes) == pytest.approx(none_peak)
    assert steps[0].fits and max(steps[0].peak_memory_bytes) == pytest.approx(block_peaks[first])
    placement = steps[2].schedule.placement
    kept = semu.activation_bytes(placement, _mbs())
    limits = memory_limit_bytes(None, semu.static_bytes(placement), limit_gb)
    for s in steps[2:]:  # phase 2 keeps every order's kept bytes within the limit
        check(s.schedule, memory_cap=limits, activation_bytes=kept)
    # Phase 3 counts transient bytes too: SEMU's peak of its plan is within the device.
    assert steps[-1].fits


@pytest.mark.parametrize("most", [0, 1, 2, 7, 45, 80, 128])
def test_least_fitting_is_the_brute_force_least(most):
    for threshold in range(1, most + 2):  # most + 1: nothing fits
        asked = []

        def fits(n):
            asked.append(n)
            return n >= threshold

        want = next((n for n in range(1, most + 1) if n >= threshold), None)
        assert least_fitting(fits, most) == want
        assert len(asked) <= (math.ceil(math.log2(most)) + 1 if most > 1 else 1)
