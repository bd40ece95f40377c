# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Checkpoints: exact resume with dropout in every layout, saves killed between files, and one
error line for every kind of bad checkpoint.

Two launches in all: one of 2 gloo ranks trains, resumes and finally dies in a save; one process
then runs the trainer's ``main`` on that crash and on damaged copies of the checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from ckpt_worker import flip_tensor_bytes
from equivalence import TINY
from launch import run, torchrun

pytestmark = pytest.mark.multiproc

CKPT_WORKER = Path(__file__).with_name("ckpt_worker.py")
DROPOUT = ["--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--train-iters", "4"]
LAYOUTS = {
    "dp2-balanced": ["--post-balance", "auto"],
    "dp2": [],
    "pp2-dynamic": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
                    "--schedule-search-rollouts", "4", "--schedule-search-budget-ms", "60000"],  # fmt: skip
    "tp2": ["--tensor-model-parallel-size", "2"],
}
MODEL_FILE = "iter_0000001/mp_rank_00/model_optim_rng.pt"


def _losses(path: Path) -> dict[int, float]:
    return {m["iteration"]: m["lm_loss"] for m in map(json.loads, path.read_text().splitlines())}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 2-rank launch: per layout, 4 iterations with dropout saving at 2 and a resume from 2
    (DP=2 balanced: saving every iteration, a resume from 1 saving at 2, and a resume of that
    resume); a load of a TP=2 checkpoint whose rank-1 file was damaged; and a run killed in
    its second save."""
    out = tmp_path_factory.mktemp("ckpt")
    configs = []
    for name, flags in LAYOUTS.items():
        ckpt, base = str(out / name), [*TINY, *DROPOUT, *flags]
        if name == "dp2-balanced":
            again = str(out / "resumed")
            configs += [
                [f"{name}-full", *base, "--save", ckpt, "--save-interval", "1"],
                [f"{name}-resumed", *base, "--load", ckpt, "--ckpt-step", "1", "--save", again,
                 "--save-interval", "1", "--exit-interval", "2"],
                [f"{name}-resumed-again", *base, "--load", again],
            ]  # fmt: skip
        else:
            configs += [
                [f"{name}-full", *base, "--save", ckpt, "--save-interval", "2"],
                [f"{name}-resumed", *base, "--load", ckpt, "--ckpt-step", "2"],
            ]
    # The pp2-dynamic checkpoint of iteration 2 (LLM in 2 chunks) loaded into the LLM cut into
    # 4 chunks, and into its own split, both without dropout for iteration 3.
    pp2 = [*TINY, *LAYOUTS["pp2-dynamic"], "--train-iters", "3", "--load", str(out / "pp2-dynamic"),
           "--ckpt-step", "2", "--no-load-optim", "--no-load-rng"]  # fmt: skip
    configs += [
        ["pp2-same-split", *pp2],
        ["pp2-other-split", *pp2, "--llm-chunks-per-stage", "2"],
        ["pp2-other-split-optim", *pp2[:-2], "--llm-chunks-per-stage", "2"],
    ]
    # Costs fitted online from the first measured iteration on, saved at 3 and resumed.
    fitted = [*TINY, "--post-balance", "auto", "--train-iters", "6", "--cost-fit-warmup", "1"]
    configs += [
        ["fit-full", *fitted, "--save", str(out / "fit"), "--save-interval", "3"],
        ["fit-resumed", *fitted, "--load", str(out / "fit"), "--ckpt-step", "3"],
        ["fit-none", *TINY, "--train-iters", "6"],
    ]
    damaged = out / "tp2" / "iter_0000002" / "mp_rank_01" / "model_optim_rng.pt"
    configs += [
        ["tp2-damaged", *TINY, *DROPOUT, *LAYOUTS["tp2"], "--load", str(out / "tp2"),
         "--ckpt-step", "2", "--flip-bytes", str(damaged)],
        ["crash", *TINY, "--train-iters", "2", "--save", str(out / "crash"), "--save-interval",
         "1", "--crash-in-save", "2"],
    ]  # fmt: skip
    argv = ["train", str(out)]
    for config in configs:
        argv += [*config, "---"]
    proc = torchrun(2, CKPT_WORKER, argv, timeout=600)
    if not (out / "crash.crashed").exists():  # the launch must end in the injected crash
        raise AssertionError(f"exit status {proc.returncode}\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-6000:]}")  # fmt: skip
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resume_with_dropout_gives_the_uninterrupted_losses_bit_for_bit(runs, layout):
    full = _losses(runs / f"{layout}-full.jsonl")
    assert sorted(full) == [1, 2, 3, 4]
    resumed = {**_losses(runs / f"{layout}-resumed.jsonl")}
    if layout == "dp2-balanced":
        assert sorted(resumed) == [2]  # from 1, saving at 2: its checkpoint is resumed again
        again = _losses(runs / f"{layout}-resumed-again.jsonl")
        assert sorted(again) == [3, 4]
        resumed.update(again)
    else:
        assert sorted(resumed) == [3, 4]
    for iteration, loss in resumed.items():
        assert loss == full[iteration], (layout, iteration, loss, full[iteration])


def test_a_model_saved_in_one_split_loads_into_another(runs):
    # Iteration 3's loss is the forward of the parameters saved after iteration 2: the same
    # whichever rank holds which LLM layers.
    same, other = _losses(runs / "pp2-same-split.jsonl"), _losses(runs / "pp2-other-split.jsonl")
    assert sorted(other) == [3]
    assert other[3] == pytest.approx(same[3], rel=1e-6)
    # The optimizer state is per rank: loading it into another split is refused by name.
    message = (runs / "pp2-other-split-optim.rank0.error").read_text()
    assert "llm0:0-2" in message and "llm0:0-1" in message and "--no-load-optim" in message


def _records(path: Path) -> dict[int, dict]:
    return {m["iteration"]: m for m in map(json.loads, path.read_text().splitlines())}


def test_a_resume_plans_with_the_fitted_costs_the_uninterrupted_run_had(runs):
    # Iteration 4's plan is made from the fits as they were after iteration 2, iteration 5's
    # after 3 (whose times were measured before the save, gathered after it): both come from
    # the checkpoint, so the resumed run makes the uninterrupted run's plans, with fitted
    # (seconds) costs, and learns bit for bit what it learnt. Later plans follow times measured
    # anew.
    full, resumed = _records(runs / "fit-full.jsonl"), _records(runs / "fit-resumed.jsonl")
    assert sorted(resumed) == [4, 5, 6]
    for i in (4, 5):
        assert full[i]["unit"] == "seconds", full[i]["unit"]
        assert resumed[i]["plan_digest"] == full[i]["plan_digest"], i
        assert resumed[i]["lm_loss"] == full[i]["lm_loss"], i
    assert resumed[6]["lm_loss"] == pytest.approx(full[6]["lm_loss"], rel=1e-5)
    # Whatever the fitted costs decided (balance or keep each phase), the run learns what
    # upstream Megatron's assignment learns.
    none = _records(runs / "fit-none.jsonl")
    for i in range(1, 7):
        assert full[i]["lm_loss"] == pytest.approx(none[i]["lm_loss"], rel=1e-5), i


def test_every_rank_saves_its_own_random_states(runs):
    # The two DP ranks drew dropout masks for different samples: their states differ, which is
    # why restoring rank 0's on both was not exact.
    manifest = json.loads((runs / "dp2" / "iter_0000002" / "manifest.json").read_text())
    assert manifest["layout"] == {"tp": 1, "pp": 1, "dp": 2, "distributed_optimizer": False,
                                  "optimizer_instances": 1, "grad_buckets": None}  # fmt: skip
    files = manifest["files"]
    assert set(files) == {
        "mp_rank_00/model_optim_rng.pt", "mp_rank_00/rng_dp_0000.pt", "mp_rank_00/rng_dp_0001.pt"
    }  # fmt: skip
    assert (
        files["mp_rank_00/rng_dp_0000.pt"]["sha256"] != files["mp_rank_00/rng_dp_0001.pt"]["sha256"]
    )
    for relative, entry in files.items():
        assert (runs / "dp2" / "iter_0000002" / relative).stat().st_size == entry["bytes"]


def test_a_damaged_file_of_one_rank_stops_every_rank_with_its_name(runs):
    messages = [(runs / f"tp2-damaged.rank{r}.error").read_text() for r in (0, 1)]
    assert messages[0] == messages[1], messages
    assert "rank 1: " in messages[0] and "mp_rank_01/model_optim_rng.pt is corrupted" in messages[0]
    assert "sha256" in messages[0]


# --------------------------------------------------------------- one process, bad checkpoints


@pytest.fixture(scope="module")
def loads(runs, tmp_path_factory):
    """The trainer's main in one process on the crashed run and on damaged copies of its
    complete iteration 1 (saved by 2 DP ranks)."""
    out = tmp_path_factory.mktemp("loads")
    crash = runs / "crash"

    def copy(name: str) -> Path:
        return Path(shutil.copytree(crash, out / name))

    truncated = copy("truncated")
    os.truncate(truncated / MODEL_FILE, (truncated / MODEL_FILE).stat().st_size // 2)
    flipped = copy("flipped")
    flip_tensor_bytes(str(flipped / MODEL_FILE))
    tracker = copy("tracker")
    (tracker / "latest_checkpointed_iteration.txt").write_text("7")
    no_rank_file = copy("no-rank-file")
    (no_rank_file / "iter_0000001" / "mp_rank_00" / "rng_dp_0001.pt").unlink()
    (out / "empty").mkdir()
    two = [*TINY, "--train-iters", "2"]
    cases = {
        "previous": [*two, "--load", str(crash), "--metrics-jsonl", str(out / "previous.jsonl")],
        "interrupted": [*two, "--load", str(crash), "--ckpt-step", "2"],
        "other-size": [*two, "--load", str(crash), "--hidden-size", "48"],
        "truncated": [*two, "--load", str(truncated)],
        "flipped": [*two, "--load", str(flipped)],
        "missing-path": [*two, "--load", str(out / "nowhere")],
        "missing-iteration": [*two, "--load", str(tracker)],
        "missing-rank-file": [*two, "--load", str(no_rank_file)],
        "other-layout": [*TINY, *DROPOUT, "--load", str(runs / "pp2-dynamic")],
        "other-schedule": [*TINY, "--train-iters", "3", "--load", str(crash)],
        "empty": [*TINY, "--load", str(out / "empty")],
    }
    argv = ["main", str(out)]
    for name, flags in cases.items():
        argv += [name, *flags, "---"]
    proc = run([sys.executable, str(CKPT_WORKER), *argv], timeout=600)
    results = {}
    for name in cases:
        if not (out / f"{name}.rc").exists():
            raise AssertionError(f"case {name} did not finish\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-6000:]}")  # fmt: skip
        results[name] = tuple(
            (out / f"{name}.{part}").read_text() for part in ("rc", "stdout", "stderr")
        )
    return out, results


def test_a_save_killed_between_files_leaves_the_previous_checkpoint(runs, loads):
    crash = runs / "crash"
    # Rank 0 wrote its model file of iteration 2, then died before its random states.
    assert (crash / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert (crash / "iter_0000002" / "mp_rank_00" / "model_optim_rng.pt").is_file()
    assert not (crash / "iter_0000002" / "manifest.json").exists()
    out, results = loads
    rc, stdout, stderr = results["previous"]
    assert rc == "0", stderr
    assert "resuming after iteration 1" in stdout
    # Saved by 2 DP ranks, resumed by 1: said once, and the rest is restored.
    assert stderr.count("random states are not restored") == 1, stderr
    resumed, crashed = _losses(out / "previous.jsonl"), _losses(runs / "crash.jsonl")
    assert sorted(resumed) == [2]
    assert resumed[2] == pytest.approx(crashed[2], rel=1e-6)  # DP=1 sums in another order
    rc, _, stderr = results["interrupted"]
    assert rc == "2"
    assert _error_line(stderr) == (
        f"error: {crash}/iter_0000002 is incomplete: it has no manifest.json, so its save did "
        "not finish or predates manifests (complete iterations: 1; incomplete: 2; choose one "
        "with --ckpt-step)"
    )


def _error_line(stderr: str) -> str:
    """The one line a bad checkpoint prints, and nothing that looks like a traceback."""
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.parametrize(
    "case,expected",
    [
        ("other-size", [f"{MODEL_FILE}: vision.", "is [32] in the checkpoint but [48] in this "
                        "model: check --vision-hidden-size", "--hidden-size"]),  # fmt: skip
        ("truncated", [f"{MODEL_FILE} has ", "bytes, manifest.json says", "truncated"]),
        ("flipped", [f"{MODEL_FILE} is corrupted: its sha256 differs from manifest.json's"]),
        ("missing-path", ["error: --load ", "nowhere does not exist"]),
        ("missing-iteration", ["latest_checkpointed_iteration.txt names iteration 7, but ",
                               "iter_0000007 does not exist (complete iterations: 1"]),  # fmt: skip
        ("missing-rank-file", ["iter_0000001/mp_rank_00/rng_dp_0001.pt is missing (listed in "
                               "manifest.json)"]),  # fmt: skip
        ("other-layout", ["iter_0000004 was saved with --tensor-model-parallel-size 1 "
                          "--pipeline-model-parallel-size 2; this run has 1 and 1"]),  # fmt: skip
        ("other-schedule", [f"{MODEL_FILE}: this run's learning-rate schedule differs",
                            "--override-opt-param-scheduler"]),  # fmt: skip
    ],
)
def test_a_bad_checkpoint_is_one_error_line_naming_the_culprit(loads, case, expected):
    _, results = loads
    rc, _, stderr = results[case]
    assert rc == "2", stderr
    line = _error_line(stderr)
    for text in expected:
        assert text in line, line


def test_an_empty_load_directory_starts_from_scratch(loads):
    _, results = loads
    rc, stdout, stderr = results["empty"]
    assert rc == "0", stderr
    assert "holds no checkpoint: starting from scratch" in stderr
    assert "> OrchWeave:" in stdout and "resuming" not in stdout
