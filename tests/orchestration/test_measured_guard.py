# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The measured guard (the schedule search's and post-balancing's): its probe pattern, its
measured gain against hand-computed medians, its decision both ways, and its state across a
resume (orchestration.measured_guard)."""

from __future__ import annotations

import pytest

from orchestration.measured_guard import (
    BLOCK,
    PROBE_LENGTH,
    PROBE_START,
    AlternatingArms,
    MeasuredGuard,
    taking_turns,
)


def _run(guard: MeasuredGuard, iterations: int, on_s: float, off_s: float, load=lambda i: 1.0):
    """Drive the guard: an iteration whose batch was searched takes ``on_s`` seconds per SEMU
    greedy second, else ``off_s``; ``load(i)`` is SEMU's greedy time of batch ``i``. The batch
    of iteration i was searched when the search ran during iteration i - 1 (one batch ahead).
    Returns, per iteration, whether the search ran during it."""
    ran = []
    for i in range(iterations):
        ran.append(guard.enabled(i))
        searched = ran[i - 1] if i else True
        guard.record(i, (on_s if searched else off_s) * load(i), load(i))
    return ran


def test_the_probe_alternates_blocks_from_its_start_and_nothing_else_changes_before():
    guard = MeasuredGuard(256)
    assert guard.probing(PROBE_START) and not guard.probing(PROBE_START - 1)
    assert not guard.probing(PROBE_START + PROBE_LENGTH)
    ran = _run(guard, PROBE_START + PROBE_LENGTH, 1.0, 1.0)
    assert ran[:PROBE_START] == [True] * PROBE_START
    blocks = [ran[PROBE_START + b * BLOCK : PROBE_START + (b + 1) * BLOCK] for b in range(6)]
    assert blocks == [[b % 2 == 0] * BLOCK for b in range(6)]
    assert guard.probing(PROBE_START + 256) and guard.next_probe == PROBE_START + 256


def test_a_search_that_measures_slower_is_turned_off_until_the_next_probe():
    guard = MeasuredGuard(64)
    ran = _run(guard, 100, on_s=1.2, off_s=1.0)
    assert guard.gain == pytest.approx(1.0 / 1.2) and not guard.on
    decided = PROBE_START + PROBE_LENGTH
    assert not any(ran[decided : PROBE_START + 64])  # off until the next probe
    assert ran[PROBE_START + 64] and guard.next_probe == PROBE_START + 128  # probed again


def test_a_search_that_measures_faster_stays_on():
    guard = MeasuredGuard(256)
    ran = _run(guard, 60, on_s=0.8, off_s=1.0)
    assert guard.gain == pytest.approx(1.25) and guard.on
    assert all(ran[PROBE_START + PROBE_LENGTH :])


def test_the_gain_is_per_greedy_second_so_heavier_batches_do_not_count_against_an_arm():
    # The on blocks' batches are twice as heavy (by SEMU's greedy time) and take twice as long:
    # per greedy second the arms are equal, and a tie goes to greedy.
    heavy = lambda i: 2.0 if ((i - PROBE_START) // BLOCK) % 2 == 0 else 1.0  # noqa: E731
    guard = MeasuredGuard(256)
    _run(guard, PROBE_START + PROBE_LENGTH + 1, 1.0, 1.0, load=heavy)
    assert guard.gain == pytest.approx(1.0) and not guard.on
    guard = MeasuredGuard(256)
    _run(guard, PROBE_START + PROBE_LENGTH + 1, 0.95, 1.0, load=heavy)
    assert guard.gain == pytest.approx(1 / 0.95) and guard.on


def test_every_blocks_first_iteration_is_left_out_and_so_are_unpredicted_batches():
    """A block's first iteration ran the schedule the previous block chose: an outlier there
    changes nothing, nor does a batch without SEMU's greedy time (0: a missed deadline)."""
    guard = MeasuredGuard(256)
    for i in range(PROBE_START + PROBE_LENGTH):
        offset = i - PROBE_START
        arm = guard.enabled(i)
        if offset >= 0 and offset % BLOCK == 0:
            guard.record(i, 100.0, 1.0)  # outlier, left out
        elif offset == 5:
            guard.record(i, 50.0, 0.0)  # no prediction, left out
        else:
            guard.record(i, 0.9 if arm else 1.0, 1.0)
    assert guard.gain == pytest.approx(1 / 0.9)


def test_bad_intervals_are_rejected_and_zero_turns_the_guard_off():
    with pytest.raises(ValueError, match="at least one probe"):
        MeasuredGuard(PROBE_LENGTH - 1)
    with pytest.raises(ValueError, match=">= 0"):
        MeasuredGuard(-1)
    guard = MeasuredGuard(0)
    assert all(_run(guard, 80, on_s=2.0, off_s=1.0)) and guard.gain is None


def test_a_resumed_guard_decides_as_the_uninterrupted_one():
    """Saved in the middle of a probe and restored into a fresh guard, the probe finishes with
    the samples taken before the save."""
    whole = MeasuredGuard(48)
    _run(whole, PROBE_START + PROBE_LENGTH + 1, on_s=0.9, off_s=1.0)
    first = MeasuredGuard(48)
    half = PROBE_START + PROBE_LENGTH // 2
    for i in range(half):
        first.record(i, (0.9 if first.enabled(i - 1 if i else 0) else 1.0), 1.0)
    resumed = MeasuredGuard(48)
    resumed.load_state_dict(first.state_dict())
    for i in range(half, PROBE_START + PROBE_LENGTH + 1):
        resumed.record(i, (0.9 if resumed.enabled(i - 1) else 1.0), 1.0)
    assert resumed.gain == pytest.approx(whole.gain) and resumed.on == whole.on
    assert resumed.next_probe == whole.next_probe == PROBE_START + 48


def _two_features(search, balance, iterations: int = 200):
    """A step the search makes 10% slower and balancing 10% faster, each guard fed its time."""
    for i in range(iterations):
        s_on, b_on = search.enabled(i), balance.enabled(i)
        t = (1.1 if s_on else 1.0) * (0.9 if b_on else 1.0)
        search.record(i, t, 1.0)
        balance.record(i, t, 1.0)
        assert not (search.probing(i) and balance.probing(i))  # never both toggled at once


def test_guards_taking_turns_each_measure_their_own_feature():
    search = MeasuredGuard(64)
    balance = taking_turns(64, search, "--post-balance-guard-interval", "--search-guard")
    assert balance.next_probe == PROBE_START + PROBE_LENGTH
    _two_features(search, balance)
    assert search.gain == pytest.approx(1 / 1.1) and not search.on
    assert balance.gain == pytest.approx(1 / 0.9) and balance.on
    # Probing at once, the search would have measured both features toggled together:
    # 1 / (1.1 x 0.9) = 1.0101, above the 1% margin, and stayed on.
    naive_search, naive_balance = MeasuredGuard(64), MeasuredGuard(64)
    for i in range(PROBE_START + PROBE_LENGTH):
        t = (1.1 if naive_search.enabled(i) else 1.0) * (0.9 if naive_balance.enabled(i) else 1.0)
        naive_search.record(i, t, 1.0)
    assert naive_search.on and naive_search.gain == pytest.approx(1 / 0.99)


def test_guards_that_cannot_take_turns_name_both_flags():
    assert taking_turns(0, MeasuredGuard(64), "--a", "--b") is None
    assert taking_turns(64, None, "--a", "--b").next_probe == PROBE_START
    with pytest.raises(ValueError, match="--a 64 and --b 128 must be equal"):
        taking_turns(64, MeasuredGuard(128), "--a", "--b")
    with pytest.raises(ValueError, match="--a 32 and --b 32 must be at least two probes"):
        taking_turns(32, MeasuredGuard(32), "--a", "--b")
    with pytest.raises(ValueError, match="--b toggles its feature in every block.*set --a 0"):
        taking_turns(64, AlternatingArms(4), "--a", "--b")
