# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's baselines as the papers ran them: recompute flags and the balanced layout.

The PP=2 runs come from the ``world2`` launch (``conftest.py``): Megatron's recompute settings
must learn what one process learns, and SEMU's activation memory for each must match the
bytes autograd kept in the run (counted as ``tools/bench/semu_memory_probe.py`` counts them);
``--pipeline-layout balanced`` must learn the same and be the placement SEMU simulates.
"""

from __future__ import annotations

import pytest
from conftest import LAYOUT_BALANCED, PP2, RECOMPUTE
from equivalence import PEAK_SAVED_BYTES, TINY, assert_equivalent

from megatron.mllm.arguments import ConfigError
from megatron.mllm.config_files import run_from_flags
from megatron.mllm.pipeline import runtime_placement
from megatron.mllm.prediction import run_cluster
from pipeweaver.placement import Placement
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

pytestmark = pytest.mark.multiproc

BALANCED_RUNS = ["pp2-1f1b-balanced", "pp2-interleaved-balanced"]


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


@pytest.mark.parametrize("schedule, k", [("1f1b", 1), ("interleaved", 2)])
def test_semu_simulates_the_trainers_balanced_layout(schedule, k):
    flags = [*TINY, *PP2, "--pipeline-schedule", schedule, "--llm-chunks-per-stage", str(k)]
    loaded = run_from_flags([*flags, *LAYOUT_BALANCED], 2)
    trainer = runtime_placement(schedule, 2, loaded.model, {"llm": k}, layout="balanced")
    schedules, _, info = build_step(loaded.semu, run_cluster(2, 2), schedule=schedule, pad=False)
    assert info["placement"] == "balanced"
    assert schedules[0].placement == trainer
    # It is not the encoders-on-stage-0 layout, which stays the default.
    assert trainer != Placement.baseline(2, loaded.semu.layers(), k)
    baseline = run_from_flags(flags, 2)
    assert runtime_placement(schedule, 2, baseline.model, {"llm": k}) == Placement.baseline(
        2, baseline.semu.layers(), k
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        ([*LAYOUT_BALANCED], "--pipeline-layout balanced needs --pipeline-schedule 1f1b or"),
        ([*LAYOUT_BALANCED, "--pipeline-schedule", "dynamic"], "--pipeline-schedule dynamic:"),
        (["--recompute-granularity", "full"], "--recompute-granularity full needs"),
        (["--recompute-granularity", "selective", "--recompute-num-layers", "2"],
         "--recompute-num-layers applies to --recompute-granularity full only"),
        (["--recompute-granularity", "selective", "--recompute-modules", "mlp"],
         "--recompute-modules mlp is not supported"),
    ],
)  # fmt: skip
def test_flags_the_baselines_cannot_run_are_one_error_naming_them(flags, message):
    with pytest.raises(ConfigError, match=message.replace("-", r"\-")):
        run_from_flags([*TINY, *PP2, *flags], 2)
