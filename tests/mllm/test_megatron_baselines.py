# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's baselines as the papers ran them: recompute flags and the balanced layout.

The PP=2 runs come from the ``world2`` launch (``conftest.py``): Megatron's recompute settings
must learn what one process learns, and SEMU's activation memory for each must match the
bytes autograd kept in the run (counted as ``tools/bench/semu_memory_probe.py`` counts them);
``--pipeline-layout balanced`` (and ``balanced-cost``, also under the dynamic pipeline) must learn
the same and be the placement SEMU simulates.
"""

from __future__ import annotations

import re

import pytest
from conftest import LAYOUT_BALANCED, LAYOUT_COST, PP2, RECOMPUTE
from equivalence import PEAK_SAVED_BYTES, TINY, assert_equivalent

from megatron.mllm.arguments import ConfigError
from megatron.mllm.config_files import run_from_flags
from megatron.mllm.partitioning import layer_costs
from megatron.mllm.pipeline import runtime_placement
from megatron.mllm.prediction import run_cluster
from pipeweaver.placement import Placement
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

pytestmark = pytest.mark.multiproc

BALANCED_RUNS = [
    "pp2-1f1b-balanced",
    "pp2-interleaved-balanced",
    "pp2-1f1b-balanced-cost",
    "pp2-dynamic-balanced-cost",
    "pp2-dynamic-auto-layout",
]


@pytest.mark.parametrize("run", [*(f"memory-{name}" for name in RECOMPUTE), *BALANCED_RUNS])
def test_recompute_and_the_balanced_layout_learn_what_one_process_learns(run, world2, reference):
    assert_equivalent(world2[run], reference)


@pytest.mark.parametrize("setting", list(RECOMPUTE))
def test_semu_activation_memory_under_recompute_matches_the_run(setting, world2):
    measured = PEAK_SAVED_BYTES[f"memory-{setting}"]
    spec = run_from_flags([*TINY, *PP2, *RECOMPUTE[setting]], 2).semu
    cluster = run_cluster(2, 2)
    schedules, mbs, _ = build_step(spec, cluster, schedule="megatron", iteration=0)
    step = Semu(spec, cluster).simulate_step(schedules, mbs, record_events=False)
    plain = run_from_flags([*TINY, *PP2], 2).semu
    plain_step = Semu(plain, cluster).simulate_step(schedules, mbs, record_events=False)
    for rank, (semu, run) in enumerate(zip(step.peak_activation_bytes, measured)):
        assert abs(semu / run - 1) <= 0.10, f"rank {rank}: SEMU {semu:.0f} B, run {run} B"
        # Recompute keeps less, and its backward reruns forwards.
        assert semu < plain_step.peak_activation_bytes[rank]
    assert step.step_time_s > plain_step.step_time_s


@pytest.mark.parametrize(
    "schedule, k, layout",
    [("1f1b", 1, "balanced"), ("interleaved", 2, "balanced"), ("1f1b", 1, "balanced-cost"),
     ("dynamic", 1, "balanced-cost"), ("dynamic", 2, "baseline")],
)  # fmt: skip
def test_semu_simulates_the_trainers_layout(schedule, k, layout):
    flags = [*TINY, *PP2, "--pipeline-schedule", schedule, "--llm-chunks-per-stage", str(k)]
    loaded = run_from_flags([*flags, "--pipeline-layout", layout], 2)
    costs = None
    if layout == "balanced-cost":
        costs, source = layer_costs(loaded.run, loaded.model)
        assert source.startswith("GFLOP from the model's FLOPs")
    trainer = runtime_placement(
        schedule, 2, loaded.model, {"llm": k}, layout=layout, layer_costs=costs
    )
    schedules, _, info = build_step(
        loaded.semu, run_cluster(2, 2), schedule=schedule, pad=False, layer_costs=costs
    )
    assert info["placement"] == layout
    assert schedules[0].placement == trainer
    if layout == "baseline":
        assert trainer == Placement.baseline(2, loaded.semu.layers(), k)
        return
    # Neither is the encoders-on-stage-0 layout, which stays the default of Megatron's
    # schedules (the dynamic pipeline's is DIP's, every module cut).
    assert trainer != Placement.baseline(2, loaded.semu.layers(), k)
    default = run_from_flags(flags, 2)
    placement = runtime_placement(schedule, 2, default.model, {"llm": k})
    if schedule == "dynamic":
        assert placement == Placement.interleaved(2, default.semu.layers(), {"llm": k})
    else:
        assert placement == Placement.baseline(2, default.semu.layers(), k)


def test_the_cost_balanced_layout_is_not_the_parameter_balanced_one():
    # With the model's FLOPs the vision encoder's layers cost the most per parameter: the
    # stages of balanced cost give the audio encoder to stage 1, those of balanced parameters
    # keep both encoders on stage 0.
    loaded = run_from_flags([*TINY, *PP2, "--pipeline-schedule", "1f1b", *LAYOUT_COST], 2)
    costs, _ = layer_costs(loaded.run, loaded.model)
    by_cost = runtime_placement("1f1b", 2, loaded.model, {}, layout="balanced-cost",
                                layer_costs=costs)  # fmt: skip
    by_params = runtime_placement("1f1b", 2, loaded.model, {}, layout="balanced")
    assert by_cost.chunks_on(0) == [("vision", 0)]
    assert by_params.chunks_on(0) == [("vision", 0), ("audio", 0)]


@pytest.mark.parametrize(
    "flags, message",
    [
        ([*LAYOUT_BALANCED], "--pipeline-layout balanced needs one of OrchWeave's runtime"),
        (["--pipeline-schedule", "1f1b", "--pipeline-layout", "interleaved"],
         "--pipeline-layout interleaved cuts every module over all stages, which only"),
        (["--pipeline-schedule", "dynamic", *LAYOUT_COST, "--vision-chunks-per-stage", "2"],
         "--vision-chunks-per-stage 2 cuts the vision encoder into chunks of its own"),
        (["--pipeline-schedule", "dynamic", *LAYOUT_COST, "--llm-chunks-per-stage", "auto"],
         "--llm-chunks-per-stage auto (DIP's partitioner) cuts every module"),
        (["--pipeline-schedule", "dynamic", *LAYOUT_BALANCED, "--llm-chunks-per-stage", "5"],
         "--pipeline-layout balanced cuts all 8 layers into"),
        (["--recompute-granularity", "full"], "--recompute-granularity full needs"),
        (["--recompute-granularity", "selective", "--recompute-num-layers", "2"],
         "--recompute-num-layers applies to --recompute-granularity full only"),
        (["--recompute-granularity", "selective", "--recompute-modules", "mlp"],
         "--recompute-modules mlp is not supported"),
    ],
)  # fmt: skip
def test_flags_the_baselines_cannot_run_are_one_error_naming_them(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_from_flags([*TINY, *PP2, *flags], 2)
