# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""explain_step: the terms add up to what was measured and to what was predicted."""

from __future__ import annotations

import json

import pytest

from megatron.mllm.cli.explain_step import explain, main
from megatron.mllm.explain import (
    TERMS,
    ExplainError,
    format_run,
    load_records,
    measured_terms,
    plan_terms,
    semu_terms,
    summarize,
)


def _timers(world=2):
    """A hand-made iteration record of 2 ranks (seconds), as iteration_record writes it."""
    return {
        "seconds": {"batch-generator": [0.02, 0.02], "forward-backward": [0.5, 0.5],
                    "encoder-forward": [0.1, 0.05], "all-to-all": [0.06, 0.11],
                    "forward-compute": [0.2, 0.2], "optimizer": [0.1, 0.1]},
        "exclusive": {"batch-generator": [0.02, 0.02], "forward-backward": [0.14, 0.14],
                      "encoder-forward": [0.1, 0.05], "all-to-all": [0.06, 0.11],
                      "forward-compute": [0.2, 0.2], "optimizer": [0.1, 0.1]},
        "detail": {"encoder-forward": {"vision": [0.1, 0.05]},
                   "all-to-all": {"vision inputs": [0.06, 0.11]}},
        "partition": {"batch-generator": [0.02, 0.02], "forward-backward": [0.5, 0.5],
                      "optimizer": [0.1, 0.1], "other": [0.01, 0.01]},
        "iteration_s": [0.63, 0.63],
        "collectives": {"all-to-all": {"wait": [0.0, 0.05], "transfer": [0.06, 0.06]}},
    }  # fmt: skip


def test_measured_terms_partition_each_ranks_iteration():
    t = _timers()
    for r in range(2):
        terms = measured_terms(t, r)
        assert set(terms) == set(TERMS)
        assert sum(terms.values()) == pytest.approx(t["iteration_s"][r])
    # Rank 1 finished its encoder early and waited 50 ms in the exchange.
    assert measured_terms(t, 1)["collective waits"] == pytest.approx(0.05)
    assert measured_terms(t, 1)["transfers"] == pytest.approx(0.06)
    assert measured_terms(t, 0)["compute"] == pytest.approx(0.3)


def test_semu_terms_leave_the_pipeline_waits_as_the_rest_of_its_step():
    record = {
        "source": "semu", "ranks": [0, 1], "step_s": 1.0, "busy_s": [0.6, 0.7],
        "category_s": {"F": [0.2, 0.3], "B": [0.4, 0.4], "host": [0.05, 0.05],
                       "allreduce": [0.01, 0.01], "optimizer": [0.1, 0.1]},
        "actions_s": {"v0F0": [0.1, 0.0], "l0F0": [0.1, 0.3], "l0B0": [0.4, 0.4]},
    }  # fmt: skip
    p = semu_terms(record)
    assert p.terms[0]["pipeline waits"] == pytest.approx(1.0 - 0.6 - 0.05 - 0.01 - 0.1)
    assert p.phases[0] == {"vision": 0.1, "llm": 0.5}


def _ideal_ratio(before, after):
    """The metadata's ideal gain (tools/bench/post_balance_cpu.py): Megatron's step is the
    slowest rank's sum over phases; the balanced one each phase's slowest rank, in turn."""
    ranks = range(len(next(iter(before.values()))))
    baseline = max(sum(v[r] for v in before.values()) for r in ranks)
    balanced = sum(max(v) for v in after.values())
    return baseline / balanced


@pytest.mark.parametrize("seed", range(5))
def test_the_plans_terms_give_the_ideal_gain_of_the_metadata(seed):
    import random

    rng = random.Random(seed)
    before = {p: [rng.uniform(1, 9) for _ in range(3)] for p in ("vision", "audio", "llm")}
    after = {p: [rng.uniform(1, 9) for _ in range(3)] for p in before}
    scale = 1e-3
    a = plan_terms(before, [0, 1, 2], per_phase_sync=False, scale=scale)
    b = plan_terms(after, [0, 1, 2], per_phase_sync=True, scale=scale)

    def step(p):
        # Compute and waits are all a plan predicts; every rank's sum is the same step.
        sums = {round(p.terms[r]["compute"] + p.terms[r]["collective waits"], 12) for r in p.terms}
        assert len(sums) == 1
        return sums.pop()

    assert step(a) / step(b) == pytest.approx(_ideal_ratio(before, after))


def _records(timers, prediction, n=3):
    return [{"iteration": i + 1, "timers": timers, "prediction": prediction} for i in range(n)]


def test_a_flop_plan_is_put_in_seconds_at_the_measured_rate(tmp_path):
    plan = {"source": "plan", "unit": "flops", "ranks": [0, 1],
            "phases": {"vision": [2e9, 1e9], "llm": [2e9, 2e9]},
            "phases_before": {"vision": [2e9, 1e9], "llm": [3e9, 1e9]}}  # fmt: skip
    s = summarize("run", _records(_timers(), plan), skip=1)
    measured_compute = sum(s.measured[r]["compute"] for r in (0, 1))
    predicted_compute = sum(s.predicted[r]["compute"] for r in (0, 1))
    assert predicted_compute == pytest.approx(measured_compute)
    assert "GFLOP/s" in s.note and s.predicted[0]["host"] is None


def test_the_cli_explains_a_run_and_a_comparison(tmp_path, capsys):
    plan = {"source": "plan", "unit": "seconds", "ranks": [0, 1],
            "phases": {"vision": [0.08, 0.07], "llm": [0.2, 0.2]},
            "phases_before": {"vision": [0.1, 0.05], "llm": [0.25, 0.15]}}  # fmt: skip
    run = tmp_path / "auto.jsonl"
    run.write_text("".join(json.dumps(r) + "\n" for r in _records(_timers(), plan)))
    base = tmp_path / "none.jsonl"
    base.write_text("".join(json.dumps({"iteration": i + 1, "timers": _timers()}) + "\n"
                            for i in range(3)))  # fmt: skip
    lines = explain(str(run), str(base), skip=1, top=20)
    text = "\n".join(lines)
    assert "where the step went, per rank" in text and "compute per rank and phase" in text
    # The baseline is predicted by the balanced run's plan (its loads before balancing).
    gain = _ideal_ratio(plan["phases_before"], plan["phases"])
    assert f"predicted gain {gain:.3f}" in text
    assert main([str(tmp_path / "missing.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read")


def test_a_timer_missing_from_some_iterations_counts_as_zero_there():
    """A host timer that runs in some iterations only (``plan`` where the plan was not made
    ahead) averages over all of them, 0 where absent: it used to make the report crash."""
    first, second = _timers(), _timers()
    for table in ("seconds", "exclusive"):
        first[table]["plan"] = [0.004, 0.006]
        first[table]["forward-backward"] = [0.136, 0.134]
    s = summarize("run", [{"iteration": i + 1, "timers": t} for i, t in
                          enumerate([first, second])], skip=0)  # fmt: skip
    assert s.host[0]["plan"] == pytest.approx(0.002)
    assert s.host[1]["plan"] == pytest.approx(0.003)
    assert s.measured[0]["host"] == pytest.approx(0.17)  # batch-generator, fb, plan, other
    assert any("host on rank 1: " in line and "plan 3.0" in line
               for line in format_run(s))  # fmt: skip


def test_records_without_timers_are_an_error(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"iteration": 1, "lm_loss": 5.0}) + "\n")
    with pytest.raises(ExplainError, match="--timing-log-level 2 --step-prediction"):
        load_records(path)


def test_a_slowest_replica_prediction_is_compared_over_the_iterations_it_was_predicted():
    """SEMU's step of every replica (megatron-core's engine, DP = 2) predicts the slowest
    replica's ranks, which change from iteration to iteration: each rank's measured terms are
    averaged over the iterations its replica was the predicted one."""
    records = []
    for i, (slow, compute) in enumerate([(0, 0.4), (1, 0.3), (0, 0.5), (1, 0.2)]):
        t = _timers()
        t["exclusive"]["forward-compute"] = [compute, compute / 2]
        prediction = {"source": "semu", "ranks": [slow], "step_s": 1.0, "busy_s": [compute],
                      "category_s": {"F": [compute]}, "actions_s": {"l0F0": [compute]}}  # fmt: skip
        records.append({"iteration": i + 1, "timers": t, "prediction": prediction})
    s = summarize("dp2", records, skip=0)
    # Rank 0 was predicted in iterations 1 and 3, rank 1 in 2 and 4: 0.4, 0.5 and 0.15, 0.1.
    assert s.measured[0]["compute"] == pytest.approx(0.45 + 0.1)  # + its encoder-forward
    assert s.measured[1]["compute"] == pytest.approx(0.125 + 0.05)
    assert s.predicted[0]["compute"] == pytest.approx(0.45)
    assert s.predicted[1]["compute"] == pytest.approx(0.25)
    # One replica predicted throughout: every iteration counts for every rank.
    for rec in records:
        rec["prediction"]["ranks"] = [1]
    s = summarize("dp2", records, skip=0)
    assert s.measured[0]["compute"] == pytest.approx((0.4 + 0.3 + 0.5 + 0.2) / 4 + 0.1)
    assert s.predicted[1]["compute"] == pytest.approx(0.35) and 0 not in s.predicted
