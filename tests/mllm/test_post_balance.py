# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Batch post-balancing in the trainer: moving work never changes what is learned."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from equivalence import TINY, assert_equivalent, variable_workload
from launch import REPO, free_port, ranks, train_runs

pytestmark = pytest.mark.multiproc


@pytest.mark.parametrize(
    "run",
    [
        "dp2-balanced",
        "dp2-balanced-no-overlap",
        "dp2-packed",
        "dp2-balanced-packed",
        "dp4-kk-node-wise",
        "dp2-pp2-whole-samples",
        "dp2-pp2-whole-samples-dynamic",
        "dp2-pp2-whole-samples-packed",
        "pp2-megatron-packed",
        "pp2-dynamic-packed",
        "dp2-pp2-whole-samples-overlap",
        "dp2-pp2-whole-samples-dynamic-overlap",
    ],
)
def test_balanced_runs_learn_what_one_process_learns(run, world2, world4, reference):
    assert_equivalent({**world2, **world4}[run], reference)


@pytest.mark.parametrize("run", ["variable-dp2-balanced", "variable-dp2-lpt-node-wise"])
def test_a_rank_without_images_or_audio_joins_every_collective(run, world2, references):
    # DP rank 1 loads text only; balancing sends it units and every collective still matches.
    assert_equivalent(world2[run], references["variable"])


def test_ranks_that_load_different_metadata_fail_with_a_digest_error():
    # Two pipeline stages of one DP rank must load the same samples; here they do not.
    port = free_port()
    procs = []
    for rank, seed in ((0, "1"), (1, "2")):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # fmt: skip
        cmd = [sys.executable, str(REPO / "scripts" / "pretrain_mllm.py"), *TINY,
               "--pipeline-model-parallel-size", "2", "--post-balance", "auto",
               "--workload-seed", seed, "--distributed-timeout-minutes", "1"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=REPO))  # fmt: skip
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode != 0
        assert "error: balance plan digest differs across ranks [1] vs rank 0" in err, err[-3000:]


@pytest.mark.parametrize(
    "pp,culprit",
    [
        # Per phase (PP = 1): the unit is the vision phase's item.
        (1, r"vision unit 0 of sample 'img-e' \(DP rank 0, position 2, stream index 4\) has size "
            r"64, more than the per-bin cap 50"),
        # Whole samples (PP = 2, one DP group): the sample with the most vision tokens.
        (2, r"sample 'img-b' \(DP rank 0, position 1, stream index 1\) has vision tokens 90, "
            r"more than the per-bin cap 50"),
    ],
)  # fmt: skip
def test_an_item_larger_than_its_cap_stops_every_rank_naming_flag_and_sizes(tmp_path, pp, culprit):
    # Each rank on its own (not torchrun, which kills the others once one fails): every rank
    # must print the line itself.
    procs = ranks(
        2,
        REPO / "scripts" / "pretrain_mllm.py",
        [*TINY, *variable_workload(tmp_path), "--post-balance", "auto",
         "--pipeline-model-parallel-size", str(pp),
         "--post-balance-token-caps", "vision=50"],  # fmt: skip
        timeout=180,
    )
    lines = []
    for proc in procs:
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, proc.stderr[-3000:]
        lines.append(errors[0])
    assert lines[0] == lines[1]
    assert lines[0].startswith("error: --post-balance-token-caps vision=50: "), lines[0]
    assert re.search(culprit, lines[0]), lines[0]


# Every rank loads the same shapes (DP=2, 2 samples per microbatch: rank 0 loads samples 0, 1,
# 4, 5, rank 1 samples 2, 3, 6, 7, each the twin of one of rank 0's): every phase is balanced as
# loaded.
ALIKE_JSONL = """\
{"id": "a0", "text_tokens": 20, "image": [{"units": [16, 16], "llm_tokens": 8}]}
{"id": "a1", "text_tokens": 30}
{"id": "b0", "text_tokens": 20, "image": [{"units": [16, 16], "llm_tokens": 8}]}
{"id": "b1", "text_tokens": 30}
{"id": "a2", "text_tokens": 5, "image": [{"units": [64], "llm_tokens": 16}], \
"audio": [{"units": [47, 47], "llm_tokens": 20}]}
{"id": "a3", "text_tokens": 12}
{"id": "b2", "text_tokens": 5, "image": [{"units": [64], "llm_tokens": 16}], \
"audio": [{"units": [47, 47], "llm_tokens": 20}]}
{"id": "b3", "text_tokens": 12}
"""


def test_a_packed_plan_that_keeps_every_phase_home_runs_megatrons_step(tmp_path):
    # Nothing would move, so the balanced step hands the iteration to Megatron's packed step:
    # the very losses and gradient norms of --post-balance none, every iteration.
    path = tmp_path / "alike.jsonl"
    path.write_text(ALIKE_JSONL)
    data = [*TINY, "--workload", str(path), "--workload-token-scale", "1", "--pack-sequences",
            "--train-iters", "3"]  # fmt: skip
    runs = train_runs(tmp_path, {"balanced": [*data, "--post-balance", "auto"], "megatron": data})
    balanced, megatron = runs["balanced"], runs["megatron"]
    assert [r["as_loaded"] for r in balanced] == [True, True, True]
    assert [r["moved_fraction"] for r in balanced] == [{"vision": 0, "audio": 0, "llm": 0}] * 3
    for a, b in zip(balanced, megatron, strict=True):
        assert (a["lm_loss"], a["grad_norm"]) == (b["lm_loss"], b["grad_norm"])
