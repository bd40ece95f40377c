# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The step timers without processes: levels, nesting, the partition, waits, the log."""

from __future__ import annotations

import pytest

from megatron.mllm.timers import (
    OTHER,
    RankTimes,
    Span,
    StepTimers,
    TimerLog,
    collective_waits,
    iteration_record,
)


class FakeClock:
    """A clock that advances 1 s per reading and counts its readings."""

    def __init__(self):
        self.now = 0.0
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        self.now += 1.0
        return self.now


def test_level_0_records_nothing_and_reads_no_clock():
    clock = FakeClock()
    syncs = []
    t = StepTimers(0, clock=clock, sync=lambda: syncs.append(1))
    with t("forward-backward", log_level=1):
        with t.span("all-to-all", 1, detail="x", group=(0, 1)):
            pass
    t("optimizer", 1).start(barrier=True)
    t("optimizer").stop(barrier=True)
    assert t.take() == [] and clock.calls == 0 and not syncs


def test_levels_nesting_and_the_partition():
    clock = FakeClock()
    t = StepTimers(1, clock=clock)
    with t("batch-generator", 1):  # 1 .. 2
        pass
    with t("forward-backward", 1):  # 3 .. 10
        with t.span("plan"):  # 4 .. 5
            pass
        t("forward-backward", 1).start()  # megatron-core's own, inside ours: shadowed
        with t.span("forward-compute", level=2):  # above the level: not recorded
            pass
        t("forward-backward").stop()
        with t.span("all-to-all", detail="vision inputs", group=[0, 1]):  # 6 .. 7
            pass
        t("optimizer-inner-step", 1).start()  # 8
        t("optimizer-inner-step").stop()  # 9
    spans = t.take()
    assert [(s.name, s.depth) for s in spans] == [
        ("batch-generator", 0), ("plan", 1), ("all-to-all", 1), ("optimizer-inner-step", 1),
        ("forward-backward", 0),
    ]  # fmt: skip
    assert spans[2].detail == "vision inputs" and spans[2].group == (0, 1)
    times = RankTimes.of(spans, iteration_s=12.0)
    assert times.top == {"batch-generator": 1.0, "forward-backward": 7.0, OTHER: 4.0}
    assert times.seconds["forward-backward"] == 7.0 and times.depth["plan"] == 1
    assert [s.name for s in times.collectives] == ["all-to-all"]
    # Self time: forward-backward less plan, all-to-all and the optimizer inside it.
    assert times.exclusive == {"batch-generator": 1.0, "plan": 1.0, "all-to-all": 1.0,
                               "optimizer-inner-step": 1.0, "forward-backward": 4.0}  # fmt: skip
    assert sum(times.exclusive.values()) + times.top[OTHER] == 12.0
    assert times.detail == {"all-to-all": {"vision inputs": 1.0}}
    assert t.take() == []


def test_compute_actions_sum_per_module_and_megatron_timers_know_their_group():
    t = StepTimers(2, clock=FakeClock(), groups={"all-grads-sync": [0, 1]})
    for action in ("v0F0", "l1F0", "l1B0", "a0B1.2"):
        name = "backward-compute" if "B" in action else "forward-compute"
        with t.span(name, level=2, detail=action):
            pass
    with t.span("recv-wait", 2, "r1:l0F0"):  # one per receive: not kept per detail
        pass
    with t("all-grads-sync", 1):
        pass
    spans = t.take()
    times = RankTimes.of(spans, iteration_s=20.0)
    assert times.detail == {
        "forward-compute": {"vision": 1.0, "llm": 1.0},
        "backward-compute": {"llm": 1.0, "audio": 1.0},
    }
    assert [s.group for s in times.collectives] == [(0, 1)]


def test_sync_runs_at_every_start_and_stop():
    syncs = []
    t = StepTimers(2, clock=FakeClock(), sync=lambda: syncs.append(1))
    with t.span("recv-wait", 2):
        pass
    assert len(syncs) == 2


def _collective(start, end, detail="x", group=(0, 1, 2)):
    return Span("all-to-all", 1, start, end, 1, detail, group)


def test_waits_split_each_rank_at_the_groups_last_arrival():
    # Rank 2 arrives last (t=5); all leave at t=6. Rank 1's clock runs 10 s ahead.
    ranks = [
        RankTimes(9.0, {}, {}, collectives=[_collective(1.0, 6.0)]),
        RankTimes(9.0, {}, {}, collectives=[_collective(13.0, 16.0)]),
        RankTimes(9.0, {}, {}, collectives=[_collective(5.0, 6.0)]),
    ]
    waits = collective_waits(ranks, offsets=[0.0, 10.0, 0.0])["all-to-all"]
    assert waits["wait"] == pytest.approx([4.0, 2.0, 0.0])
    assert waits["transfer"] == pytest.approx([1.0, 1.0, 1.0])


def test_waits_match_calls_by_detail_and_occurrence():
    a = [_collective(0.0, 2.0, "in", (0, 1)), _collective(3.0, 4.0, "out", (0, 1))]
    b = [_collective(1.0, 2.0, "in", (0, 1)), _collective(3.5, 4.0, "out", (0, 1))]
    waits = collective_waits([RankTimes(5, {}, {}, collectives=a), RankTimes(5, {}, {}, collectives=b)],
                             [0.0, 0.0])["all-to-all"]  # fmt: skip
    assert waits["wait"] == pytest.approx([1.0 + 0.5, 0.0])
    assert waits["transfer"] == pytest.approx([1.0 + 0.5, 1.0 + 0.5])


@pytest.mark.parametrize("option", ["max", "minmax", "all"])
def test_the_log_averages_the_interval_like_megatron(option):
    t0 = RankTimes(0.3, {"forward-backward": 0.2, "plan": 0.01}, {"forward-backward": 0.2, OTHER: 0.1},
                   {"forward-backward": 0, "plan": 1})  # fmt: skip
    t1 = RankTimes(0.3, {"forward-backward": 0.25}, {"forward-backward": 0.25, OTHER: 0.05},
                   {"forward-backward": 0})  # fmt: skip
    log = TimerLog(option)
    for _ in range(2):
        log.add(iteration_record([t0, t1], [0.0, 0.0]))
    text = log.format()
    if option == "minmax":
        assert "(min, max) time across ranks (ms):" in text
        assert "forward-backward" in text and "(200.00, 250.00)" in text
        assert "  plan" in text and "(0.00, 10.00)" in text
    elif option == "max":
        assert "max time across ranks (ms):" in text and ": 250.00" in text
    else:
        assert "rank  1: 250.00" in text
    assert text.splitlines()[-1].strip().startswith(OTHER) or option == "all"
