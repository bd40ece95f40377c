# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Timers in real runs: they cover every iteration on every rank, and cost nothing at level 0."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest
from golden_losses import MAIN_JOB
from launch import check, torchrun

pytestmark = pytest.mark.multiproc

TRAIN_WORKER = Path(__file__).with_name("train_worker.py")
COUNT_WORKER = Path(__file__).with_name("timer_count_worker.py")
LEVEL2 = [
    "--timing-log-level", "2", "--timing-log-option", "all", "--train-iters", "3",
    "--step-prediction",
]  # fmt: skip
RUNS = {
    "dp2-balanced": ["--post-balance", "auto"],
    "pp2-dynamic": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
                    "--schedule-search-rollouts", "4", "--schedule-search-budget-ms", "60000"],  # fmt: skip
}


@pytest.fixture(scope="module")
def timed_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("timed")
    argv = [str(out)]
    for name, flags in RUNS.items():
        # TensorBoard and wandb (offline) from the trainer: read back below.
        writers = ["--tensorboard-dir", str(out / name / "tb"), "--log-timers-to-tensorboard",
                   "--wandb-project", "orchweave-test", "--wandb-save-dir", str(out / name)]  # fmt: skip
        argv += [name, *MAIN_JOB, *flags, *LEVEL2, *writers, "---"]
    proc = check(torchrun(2, TRAIN_WORKER, argv, timeout=600))
    records = {
        name: [json.loads(line) for line in (out / f"{name}.jsonl").read_text().splitlines()]
        for name in RUNS
    }
    return proc, records, out


@pytest.mark.parametrize("run", sorted(RUNS))
def test_timers_account_for_every_iteration_on_every_rank(run, timed_runs):
    _, records, _ = timed_runs
    assert len(records[run]) == 3
    for rec in records[run]:
        t = rec["timers"]
        for rank, total in enumerate(t["iteration_s"]):
            parts = {name: per_rank[rank] for name, per_rank in t["partition"].items()}
            assert sum(parts.values()) == pytest.approx(total, rel=1e-9)
            assert 0 <= parts["other"] <= 0.10 * total, (run, rank, parts)
            assert parts["forward-backward"] > 0 and parts["optimizer"] > 0


def test_the_balanced_step_times_its_phases_and_splits_collective_waits(timed_runs):
    _, records, _ = timed_runs
    t = records["dp2-balanced"][-1]["timers"]
    for name in ("plan-wait", "encoder-forward", "encoder-backward", "llm-microbatches",
                 "all-to-all", "metadata-gather", "all-grads-sync", "forward-compute"):  # fmt: skip
        assert name in t["seconds"] and len(t["seconds"][name]) == 2, name
    # The first iteration plans in its step; every later one finds its plan made ahead, and its
    # digest checked on the metadata gather: no plan, no digest collective on the critical path.
    first = records["dp2-balanced"][0]["timers"]["seconds"]
    assert "plan" in first and "plan-digest" in first
    for rec in records["dp2-balanced"][1:]:
        assert (
            "plan" not in rec["timers"]["seconds"] and "plan-digest" not in rec["timers"]["seconds"]
        )
        assert rec["plan_source"] == "ahead"
    # One all-to-all per hop, whatever the number of encoders: inputs and tokens, encoder
    # outputs, and their backward.
    assert sorted(t["detail"]["all-to-all"]) == [
        "encoder outputs",
        "encoder outputs backward",
        "inputs and tokens",
    ]
    waits = t["collectives"]["all-to-all"]
    for rank in range(2):
        assert waits["wait"][rank] >= 0 and waits["transfer"][rank] >= 0
        assert waits["wait"][rank] + waits["transfer"][rank] == pytest.approx(
            t["seconds"]["all-to-all"][rank], rel=1e-6
        )


def test_the_runtime_times_every_action(timed_runs):
    proc, records, _ = timed_runs
    t = records["pp2-dynamic"][-1]["timers"]
    for name in ("schedule", "forward-compute", "backward-compute", "recv-post", "recv-wait",
                 "send-post"):  # fmt: skip
        assert all(v > 0 for v in t["seconds"][name]), name
    # --timing-log-option all: every rank's time of every timer in the log.
    assert "times across ranks (ms):" in proc.stdout and "rank  1:" in proc.stdout


def test_each_iteration_records_what_was_predicted_for_it(timed_runs):
    _, records, _ = timed_runs
    for rec in records["dp2-balanced"]:
        # PP = 1 balanced: the plan's predicted load of every phase on both ranks.
        p = rec["prediction"]
        assert p["source"] == "plan" and set(p["phases"]) == {"vision", "audio", "llm"}
        assert all(len(loads) == 2 and min(loads) > 0 for loads in p["phases"].values())
    for rec in records["pp2-dynamic"]:
        # PP = 2: SEMU's step of the replica, stage by stage, for the schedule that ran.
        p = rec["prediction"]
        assert p["source"] == "semu" and p["ranks"] == [0, 1]
        assert p["step_s"] > 0 and len(p["busy_s"]) == 2
        assert max(p["busy_s"]) <= p["step_s"] * (1 + 1e-9)
        fwd = p["compute_s"]["forward-compute"]
        assert all(v > 0 for v in fwd)


def test_level_0_adds_no_clock_reading_no_gather_and_no_collective(tmp_path):
    flags = [*MAIN_JOB, "--post-balance", "auto", "--train-iters", "2"]
    check(torchrun(2, COUNT_WORKER, [str(tmp_path), *flags], timeout=300))
    counts = json.loads((tmp_path / "counts.json").read_text())
    level0, level1 = counts["0"], counts["1"]
    assert not {k for k in level0 if k.startswith("timers.")}, level0
    assert level1["timers.clock"] > 0 and level1["timers.all_gather_objects"] == 2
    assert level1["timers.clock_offsets"] == 1
    # The collectives the timers add at level 1 are exactly their own gathers and the offsets'
    # ping-pong; level 0 runs the step's collectives only.
    extra = {k: level1.get(k, 0) - level0.get(k, 0) for k in set(level0) | set(level1)}
    assert extra["dist.all_gather_object"] == 2
    for name in ("dist.all_reduce", "dist.all_gather", "dist.all_to_all_single", "dist.barrier"):
        assert extra.get(name, 0) == 0, (name, extra)


@pytest.mark.parametrize("run", sorted(RUNS))
def test_tensorboard_and_wandb_get_the_runs_scalars(run, timed_runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_reporting import _wandb_history

    _, records, out = timed_runs
    events = EventAccumulator(str(out / run / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"lm_loss", "learning_rate", "grad_norm", "samples_per_s", "tokens_per_s",
                "tflops_per_gpu", "iteration_time_s", "timers/forward-backward/max",
                "timers/optimizer/max", "imbalance/vision"}  # fmt: skip
    if run == "dp2-balanced":
        expected |= {"imbalance_balanced/vision", "bytes_moved", "prediction/phases/llm/max"}
    else:
        expected |= {"prediction/step_s", "prediction/busy_s/max"}
    assert expected <= tags, expected - tags
    losses = [(e.step, e.value) for e in events.Scalars("lm_loss")]
    assert losses == [(r["iteration"], pytest.approx(r["lm_loss"])) for r in records[run]]
    (history,) = glob.glob(str(out / run / "wandb" / "offline-run-*" / "*.wandb"))
    rows = _wandb_history(history)
    assert [row["lm_loss"] for row in rows] == pytest.approx([r["lm_loss"] for r in records[run]])


@pytest.mark.parametrize("run", sorted(RUNS))
def test_explain_step_cuts_every_real_iteration_into_terms(run, timed_runs, tmp_path):
    from megatron.mllm.cli.explain_step import explain
    from megatron.mllm.explain import measured_terms, semu_terms

    _, records, out = timed_runs
    for rec in records[run]:
        for rank, total in enumerate(rec["timers"]["iteration_s"]):
            assert sum(measured_terms(rec["timers"], rank).values()) == pytest.approx(total)
        if rec["prediction"]["source"] == "semu":
            # SEMU's intervals of each stage fit in its step: what is left is pipeline waits.
            for t in semu_terms(rec["prediction"]).terms.values():
                assert t["pipeline waits"] >= -1e-9 and t["compute"] > 0
    text = "\n".join(explain(str(out / f"{run}.jsonl"), None, skip=1, top=12))
    assert "where the step went, per rank" in text and "compute per rank and phase" in text
