# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Per-phase post-balancing with TP = 2, DP = 2 (4 gloo ranks) and everything that needs every
rank's measured times: the online cost fit with its exchange check, and the alternation of the
post-balance guard. Each TP rank gathers the times over its own DP group; the step first makes
its control words equal across the TP group (``PhaseBalancedStep.control_words``), so every
rank fits the same costs and makes the same plans. The oracle of "the same plans" is the
trainer's own world-wide digest check, which stops the run on any difference; the oracle of
correctness is ``--post-balance none``'s losses and samples."""

from __future__ import annotations

import pytest
from golden_losses import MAIN_JOB
from launch import train_runs

from orchestration.measured_guard import AlternatingArms

pytestmark = pytest.mark.multiproc

TP2 = ["--tensor-model-parallel-size", "2", "--train-iters", "6", "--lr-decay-iters", "6"]
RUNS = {
    "none": [*TP2],
    # The fits are warm after one measured iteration: plans 3 to 6 use fitted seconds.
    "fitted": [*TP2, "--post-balance", "auto", "--cost-fit-warmup", "1"],
    "alternating": [*TP2, "--post-balance", "auto", "--post-balance-alternate", "2"],
}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp-balanced")
    runs = {name: [*MAIN_JOB, *flags] for name, flags in RUNS.items()}
    return train_runs(out, runs, nproc=4, timeout=900)


def test_the_cost_fit_runs_with_tp_and_learns_what_megatron_learns(records):
    fitted, none = records["fitted"], records["none"]
    assert len(fitted) == len(none) == 6
    units = [r["unit"] for r in fitted]
    assert units[:2] == ["flops", "flops"] and units[2:] == ["seconds"] * 4, units
    assert fitted[-1]["lm_loss"] != none[0]["lm_loss"]  # it trained
    assert [r["lm_loss"] for r in fitted] == pytest.approx([r["lm_loss"] for r in none], rel=1e-5)
    assert [r["samples"] for r in fitted] == [r["samples"] for r in none]


def test_the_alternation_runs_with_tp_and_learns_what_megatron_learns(records):
    alternating, none = records["alternating"], records["none"]
    pattern = AlternatingArms(2, first_on=True)
    assert [r["balanced"] for r in alternating] == [pattern.enabled(i) for i in range(6)]
    losses = [r["lm_loss"] for r in alternating]
    assert losses == pytest.approx([r["lm_loss"] for r in none], rel=1e-5)
