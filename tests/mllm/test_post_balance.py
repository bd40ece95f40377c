# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Batch post-balancing in the trainer: moving work never changes what is learned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from equivalence import TINY, assert_equivalent, gradients
from launch import REPO, free_port, torchrun

pytestmark = pytest.mark.multiproc

# Samples 2, 3, 6 and 7 are text only: with DP=2 and 2 samples per microbatch, DP rank 1
# (Megatron's order gives it samples 2, 3, 6, 7) loads no image and no audio at all.
ZERO_ITEMS_JSONL = """\
{"id": "img-a", "text_tokens": 20, "image": [{"units": [16, 16], "llm_tokens": 8}]}
{"id": "img-b", "text_tokens": 9, "image": [24, {"units": [40], "llm_tokens": 10}]}
{"id": "txt-c", "text_tokens": 30}
{"id": "txt-d", "text_tokens": 12}
{"id": "img-e", "text_tokens": 5, "image": [{"units": [64], "llm_tokens": 16}], \
"audio": [{"units": [47, 47], "llm_tokens": 20}]}
{"id": "img-f", "text_tokens": 40, "image": [{"units": [32], "llm_tokens": 8}]}
{"id": "txt-g", "text_tokens": 7}
{"id": "txt-h", "text_tokens": 64}
"""


def test_dp2_per_phase_balancing_equals_dp1(tmp_path, reference):
    assert_equivalent(gradients(tmp_path, 2, ["--post-balance", "auto"]), reference)


def test_dp4_node_wise_balancing_equals_dp1(tmp_path, reference):
    # 4 processes simulate 2 nodes x 2 ranks.
    flags = ["--post-balance", "kk", "--node-wise-a2a", "--gpus-per-node", "2"]
    assert_equivalent(gradients(tmp_path, 4, flags), reference)


def test_dp2_pp2_whole_sample_balancing_equals_dp1(tmp_path, reference):
    flags = ["--post-balance", "auto", "--pipeline-model-parallel-size", "2"]
    assert_equivalent(gradients(tmp_path, 4, flags), reference)


def test_a_rank_without_images_or_audio_joins_every_collective(tmp_path):
    data = tmp_path / "zero.jsonl"
    data.write_text(ZERO_ITEMS_JSONL)
    workload = ["--workload", str(data), "--workload-token-scale", "1"]
    ref = gradients(tmp_path, 1, workload)
    for balance in (["--post-balance", "auto"], ["--post-balance", "lpt", "--node-wise-a2a",
                                                  "--gpus-per-node", "1"]):  # fmt: skip
        assert_equivalent(gradients(tmp_path, 2, [*workload, *balance]), ref)


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


def test_an_item_larger_than_its_cap_names_the_sample(tmp_path):
    data = tmp_path / "zero.jsonl"
    data.write_text(ZERO_ITEMS_JSONL)
    proc = torchrun(
        2,
        REPO / "scripts" / "pretrain_mllm.py",
        [*TINY, "--workload", str(data), "--workload-token-scale", "1",
         "--post-balance", "auto", "--post-balance-token-caps", "vision=50"],  # fmt: skip
        timeout=180,
    )
    assert proc.returncode != 0
    assert "img-e" in proc.stderr and "50" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("error:") == 2, "both ranks must stop with the error"
