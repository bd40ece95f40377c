# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The search guard in a real PP=2 run (2 gloo ranks): its probe, its decision and the greedy
window between probes run on both stages without a hang, and the run learns what a greedy run
learns; so does a run alternating the searched and greedy orders for the benchmarks
(``--schedule-search-alternate``)."""

from __future__ import annotations

import os

import pytest
import torch
from golden_losses import MAIN_JOB
from launch import train_runs

from orchestration.measured_guard import (
    BLOCK,
    PROBE_LENGTH,
    PROBE_START,
    AlternatingArms,
    MeasuredGuard,
)

pytestmark = pytest.mark.multiproc

INTERVAL = PROBE_LENGTH + 2 * BLOCK  # the probe and a window of two blocks after it
ITERS = PROBE_START + INTERVAL + BLOCK  # through the second probe's first block
PP2 = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
       "--train-iters", str(ITERS), "--lr-decay-iters", str(ITERS)]  # fmt: skip
RUNS = {
    "greedy": [*PP2, "--schedule-search-budget-ms", "0"],
    "guarded": [*PP2, "--schedule-search-rollouts", "4", "--schedule-search-budget-ms", "60000",
                "--schedule-search-guard-interval", str(INTERVAL)],  # fmt: skip
    "alternating": [*PP2, "--schedule-search-rollouts", "4", "--schedule-search-budget-ms",
                    "60000", "--schedule-search-alternate", "3",
                    "--schedule-search-alternate-first", "greedy"],  # fmt: skip
}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("guard")


@pytest.fixture(scope="module")
def records(out):
    return train_runs(out, {name: [*MAIN_JOB, *flags] for name, flags in RUNS.items()})


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="Linux threads only")
def test_every_gloo_group_of_the_runs_shared_one_transport_thread(out, records):
    # megatron.mllm.distributed.share_gloo_device: megatron-core's groups and the runtime's
    # send and receive groups (over 20 here) on one device, through three trainers in turn.
    for rank in (0, 1):
        for name in RUNS:
            assert torch.load(out / name / f"rank{rank}.pt")["gloo_transport_threads"] == 1


def test_the_guard_probes_decides_and_learns_what_greedy_learns(records):
    guarded = records["guarded"]
    assert len(guarded) == ITERS
    sources = [r["schedule_search"]["source"] for r in guarded]
    # A batch was planned during the iteration before it, in that iteration's block; a search
    # (or greedy's SEMU time) not done when its step starts is 'missed', whatever the block.
    pattern = MeasuredGuard(INTERVAL)
    decided = PROBE_START + PROBE_LENGTH
    for i in range(1, decided + 1):
        expected = "searched" if pattern.enabled(i - 1) else "guard"
        assert sources[i] in (expected, "missed"), (i, sources[i])
    after = set(sources[decided + 1 : PROBE_START + INTERVAL])
    gain = guarded[decided + 1]["schedule_search"]["guard_gain"]
    assert gain > 0
    if gain >= 1.01:
        assert after <= {"searched", "missed"}, after  # kept on: searched ahead every batch
    else:
        assert after == {"guard"}, after  # off: each stage orders its own batches
    # The second probe starts on time: its first batch greedy, then its first block searched.
    second = PROBE_START + INTERVAL
    assert sources[second] == "guard" or sources[second] == "missed"
    assert set(sources[second + 1 : second + BLOCK]) <= {"searched", "missed"}
    losses = [r["lm_loss"] for r in guarded]
    reference = [r["lm_loss"] for r in records["greedy"]]
    assert losses == pytest.approx(reference, rel=1e-5)


def test_an_alternating_run_searches_every_other_block_and_learns_what_greedy_learns(records):
    run = records["alternating"]
    sources = [r["schedule_search"]["source"] for r in run]
    pattern = AlternatingArms(3, first_on=False)
    # Iteration 1 is greedy's (first block) and planned in the step; each later batch was
    # planned during the iteration before it, in that iteration's block.
    assert sources[0] == "guard"
    for i in range(1, len(run)):
        expected = "searched" if pattern.enabled(i - 1) else "guard"
        assert sources[i] in (expected, "missed"), (i, sources[i])
    assert {"searched", "guard"} <= set(sources)
    losses = [r["lm_loss"] for r in run]
    reference = [r["lm_loss"] for r in records["greedy"]]
    assert losses == pytest.approx(reference, rel=1e-5)
