# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""End-to-end runs of the trainer on 2 gloo processes: learning, equivalence, resume, errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from equivalence import TINY, assert_equivalent
from launch import REPO, check, main_job, ranks, torchrun

from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

pytestmark = pytest.mark.multiproc


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def dp2_run(tmp_path_factory):
    """The main job at DP=2 for its 30 iterations, with per-iteration metrics."""
    out = tmp_path_factory.mktemp("dp2")
    proc = check(main_job(2, ["--metrics-jsonl", str(out / "metrics.jsonl")]))
    return proc, read_metrics(out / "metrics.jsonl")


def _loss_falls(metrics: list[dict]) -> None:
    losses = [m["lm_loss"] for m in metrics]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert (
        last < first - 0.5
    ), f"loss did not fall: first five {losses[:5]}, last five {losses[-5:]}"


def test_dp2_run_learns_and_logs_like_megatron(dp2_run):
    proc, metrics = dp2_run
    _loss_falls(metrics)
    lines = [line for line in proc.stdout.splitlines() if " iteration " in line]
    assert len(lines) == 6, proc.stdout[-3000:]
    for field in (
        "elapsed time per iteration (ms)",
        "throughput per GPU (TFLOP/s/GPU)",
        "samples per second",
        "tokens per second",
        "lm loss",
        "DP imbalance max/mean: vision",
    ):
        assert field in lines[-1], f"{field!r} missing from {lines[-1]}"
    # Two DP ranks load different samples: some phase is imbalanced in some iteration, and the
    # main job's post-balancing lowers the worst of them.
    assert max(max(m["imbalance"].values()) for m in metrics) > 1.05
    before = sum(max(m["imbalance"].values()) for m in metrics)
    after = sum(max(m["imbalance_balanced"].values()) for m in metrics)
    assert after < before, (before, after)
    assert "DP=2" in proc.stdout and "post-balance: auto" in proc.stdout
    assert "bytes moved per iteration" in lines[-1]


def test_the_main_job_log_is_the_setup_line_and_the_iteration_lines(dp2_run):
    # megatron-core's argument and parameter listings and its import warnings are debug-level.
    proc, _ = dp2_run
    log = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(log) < 60, "\n".join(log[:80])
    assert sum(line.startswith("> OrchWeave:") for line in log) == 1
    assert not any("Warning" in line or "arguments ----" in line for line in log), log


PP2_ITERS = 10
"""The PP=2 runs' length: the first third of the main job, on its learning-rate schedule."""


@pytest.mark.parametrize(
    "schedule,marker",
    [("megatron", "forward_backward_pipelining_without_interleaving"), ("dynamic", "dynamic")],
)
def test_pp2_runs_learn_what_the_dp2_run_learns(dp2_run, tmp_path, schedule, marker):
    # Two stages over the same global batches learn the DP=2 run's losses: DP splits each
    # batch between ranks and balances it, PP runs it whole through two stages.
    _, full = dp2_run
    flags = ["--post-balance", "none", "--pipeline-schedule", schedule,
             "--pipeline-model-parallel-size", "2", "--train-iters", str(PP2_ITERS),
             "--lr-decay-iters", str(len(full)),
             "--metrics-jsonl", str(tmp_path / "m.jsonl")]  # fmt: skip
    proc = check(main_job(2, flags))
    assert f"schedule: {marker}" in proc.stdout, proc.stdout[-2000:]
    losses = [m["lm_loss"] for m in read_metrics(tmp_path / "m.jsonl")]
    assert len(losses) == PP2_ITERS
    assert losses == pytest.approx([m["lm_loss"] for m in full[:PP2_ITERS]], rel=1e-5)


def test_resume_continues_exactly(dp2_run, tmp_path):
    _, full = dp2_run
    ckpt = tmp_path / "ckpt"
    first = check(
        main_job(2, ["--save", str(ckpt), "--save-interval", "10", "--exit-interval", "10"])
    )
    assert "exiting program at iteration 10" in first.stdout
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "10"
    assert (ckpt / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt").is_file()
    check(main_job(2, ["--load", str(ckpt), "--metrics-jsonl", str(tmp_path / "resumed.jsonl")]))
    resumed = read_metrics(tmp_path / "resumed.jsonl")
    assert [m["iteration"] for m in resumed] == list(range(11, 31))
    expected = {m["iteration"]: m["lm_loss"] for m in full}
    # The fits take over after 8 iterations, and from then on each plan follows measured
    # times. `full` is another run than the one that saved, so its plans may differ from
    # the checkpoint's, and the order of float sums with them: within round-off. That a
    # resume makes the saving run's own next plans, bit for bit, is tested in
    # test_checkpointing.py (fit-full / fit-resumed).
    for m in resumed:
        i = m["iteration"]
        assert m["lm_loss"] == pytest.approx(expected[i], rel=1e-5), (i, m, expected)


# ------------------------------------------------------------------------ gradient equivalence


def test_reference_gradients_reach_every_module(reference):
    grads, _, loss = reference
    assert float(loss[1]) > 0
    for module in ("vision", "audio", "llm"):
        norms = [float(g.norm()) for n, g in grads.items() if n.startswith(module + ".")]
        assert norms and max(norms) > 0, f"no gradient reached the {module} module"
    assert any(n.startswith("vision.projector") for n in grads)


@pytest.mark.parametrize("layout", ["pp2-megatron", "dp2", "tp2"])
def test_parallel_layouts_learn_what_one_process_learns(layout, world2, reference):
    assert_equivalent(world2[layout], reference)


# ------------------------------------------------------------------------------- bad input


def test_sample_longer_than_seq_length_fails_every_rank_with_its_name():
    gen = WorkloadGenerator(
        WorkloadSpec.load("omni-three-modality"), seed=1234, token_scale=0.03125
    )
    first_batch = gen.samples(8)  # iteration 0 of the global batch of 8
    longest = max(first_batch, key=lambda s: s.llm_tokens)
    limit = longest.llm_tokens - 1
    culprit = next(s for s in first_batch if s.llm_tokens > limit)
    proc = torchrun(
        2,
        REPO / "scripts" / "pretrain_mllm.py",
        [*TINY, "--seq-length", str(limit), "--max-position-embeddings", str(limit)],
        timeout=180,
    )
    assert proc.returncode != 0
    message = f"error: sample {culprit.sample_id!r}"
    assert proc.stderr.count(message) == 2, f"both ranks must name the sample:\n{proc.stderr}"
    assert f"more than --seq-length {limit}" in proc.stderr


def test_an_error_found_before_the_process_groups_stops_every_rank_alike():
    # Every rank reads the workload before distributed init and finds the same first sample
    # (test_arguments.py runs the other such checks in process). The ranks run on their own:
    # under torchrun the first to fail gets the others killed, often before they print.
    procs = ranks(2, REPO / "scripts" / "pretrain_mllm.py", [*TINY, "--vision-num-layers", "0"])
    lines = []
    for proc in procs:
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, proc.stderr[-3000:]
        lines.append(errors[0])
    assert lines[0] == lines[1]
    assert re.fullmatch(
        r"error: sample 'omni-three-modality-1234-\d+' \(stream index \d+\) has image items but "
        r"the model has no vision encoder \(--vision-num-layers is 0\)",
        lines[0],
    ), lines[0]
