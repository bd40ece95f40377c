# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The post-balance guard in a real DP=2 run of the main job (2 gloo ranks): its probe, its
decision and the window until the next probe run on both ranks without a hang, each iteration
balanced or run as Megatron would exactly as the guard's pattern says, and the run learns what
``--post-balance none`` learns; so does the benchmark's alternation
(``--post-balance-alternate``)."""

from __future__ import annotations

import pytest
from golden_losses import MAIN_JOB
from launch import train_runs

from orchestration.measured_guard import (
    BLOCK,
    MARGIN,
    PROBE_LENGTH,
    PROBE_START,
    AlternatingArms,
    MeasuredGuard,
)

pytestmark = pytest.mark.multiproc

INTERVAL = PROBE_LENGTH + 2 * BLOCK
ITERS = PROBE_START + INTERVAL + 1  # the second probe's first iteration
LONG = ["--train-iters", str(ITERS), "--lr-decay-iters", str(ITERS)]
RUNS = {
    "none": [*LONG],
    "guarded": [*LONG, "--post-balance", "auto", "--post-balance-guard-interval", str(INTERVAL)],
    # The benchmark's crossover: the first 12 iterations of the same schedule, in blocks of 3.
    "alternating": [*LONG, "--train-iters", "12", "--post-balance", "auto",
                    "--post-balance-alternate", "3", "--post-balance-alternate-first", "megatron"],
}  # fmt: skip


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("balance-guard")
    return train_runs(out, {name: [*MAIN_JOB, *flags] for name, flags in RUNS.items()})


def test_the_guard_probes_decides_and_learns_what_megatron_learns(records):
    guarded = records["guarded"]
    assert len(guarded) == ITERS
    balanced = [r["balanced"] for r in guarded]
    sources = [r["plan_source"] for r in guarded]
    pattern = MeasuredGuard(INTERVAL)
    decided = PROBE_START + PROBE_LENGTH
    # Until the probe has measured its last iteration (that time arrives with the next batch),
    # the pattern alone says which iterations are balanced.
    assert balanced[: decided + 1] == [pattern.enabled(i) for i in range(decided + 1)]
    for i in range(PROBE_START, decided):
        if not balanced[i]:
            assert sources[i] == "guard"
        else:  # a balanced block's first plan is made in its step, not in the block before
            first = (i - PROBE_START) % BLOCK == 0 and i > PROBE_START
            assert sources[i] == ("step" if first else "ahead"), (i, sources[i])
    gain = guarded[decided + 1]["balance_guard_gain"]
    assert gain > 0
    window = balanced[decided + 1 : PROBE_START + INTERVAL]
    assert window == [gain >= 1 + MARGIN] * len(window), (gain, window)
    # The second probe starts on time with a balanced block.
    assert all(balanced[PROBE_START + INTERVAL :])
    # Balanced or not, every iteration learns what Megatron's assignment learns.
    losses = [r["lm_loss"] for r in guarded]
    assert losses == pytest.approx([r["lm_loss"] for r in records["none"]], rel=1e-5)
    assert [r["samples"] for r in guarded] == [r["samples"] for r in records["none"]]


def test_the_alternation_runs_its_blocks_for_the_whole_run_and_learns_the_same(records):
    alternating = records["alternating"]
    pattern = AlternatingArms(3, first_on=False)
    assert [r["balanced"] for r in alternating] == [pattern.enabled(i) for i in range(12)]
    sources = [r["plan_source"] for r in alternating]
    assert sources == ["guard"] * 3 + ["step", "ahead", "ahead"] + ["guard"] * 3 + [
        "step",
        "ahead",
        "ahead",
    ]
    losses = [r["lm_loss"] for r in alternating]
    assert losses == pytest.approx([r["lm_loss"] for r in records["none"][:12]], rel=1e-5)
