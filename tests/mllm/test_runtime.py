# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's pipeline runtime: any valid schedule learns what one process learns."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from equivalence import TINY, assert_equivalent
from launch import REPO, check, free_port, torchrun

pytestmark = pytest.mark.multiproc

WORKER = Path(__file__).with_name("runtime_worker.py")
FUZZED = 64
"""Random valid schedules run at PP=2 (each a whole step; the fuzzer's own tests check 200
schedules statically without running them)."""
DYNAMIC = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
           "--schedule-search-rollouts", "4", "--schedule-search-budget-ms", "60000"]  # fmt: skip


@pytest.mark.parametrize(
    "run",
    ["pp2-1f1b", "pp2-interleaved", "pp2-dynamic", "pp2-dynamic-subs-recompute",
     "pp2-dynamic-memory-limit"],
)  # fmt: skip
def test_runtime_schedules_learn_what_one_process_learns(run, world2, reference):
    assert_equivalent(world2[run], reference)


@pytest.mark.parametrize("run", ["variable-pp2-dynamic", "variable-pp2-dynamic-auto"])
def test_microbatches_with_0_1_and_many_images_with_and_without_audio(run, world2, references):
    assert_equivalent(world2[run], references["variable"])


def test_fuzzed_schedules_and_a_memory_plan_learn_what_one_process_learns(tmp_path, reference):
    """Fuzzed orders with random strategies, and the greedy order under a memory limit with
    keep, recompute and offload planned per F/B pair by the memory ILP (runtime_worker.py)."""
    flags = [
        *TINY,
        *DYNAMIC,
        "--encoder-sub-microbatch-tokens",
        "40",
        "--llm-chunks-per-stage",
        "2",
    ]
    proc = check(torchrun(2, WORKER, ["fuzz", str(tmp_path), str(FUZZED), *flags], timeout=600))
    assert proc.stdout.count(f"fuzzed {FUZZED} schedules") == 2
    assert proc.stdout.count("rejected: rank ") == 2
    assert proc.stdout.count("planned strategies ['none', 'offload', 'recompute']") == 2
    for run in ("grads", "planned"):
        grads = {}
        for r in range(2):
            grads.update(torch.load(tmp_path / f"rank{r}.pt")[run])
        assert set(grads) == set(reference[0])
        for name, g in grads.items():  # the worker checked the others against the first
            ref = reference[0][name]
            rel = float((g - ref).norm() / ref.norm().clamp_min(1e-30))
            assert rel <= 1e-5, f"{run} {name}: relative gradient difference {rel:.2e}"


def test_a_rank_that_dies_mid_step_ends_every_rank_without_a_hang():
    port = free_port()
    procs = []
    start = time.monotonic()
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")  # fmt: skip
        cmd = [sys.executable, str(WORKER), "die", "1", "1", *TINY, *DYNAMIC,
               "--distributed-timeout-minutes", "1"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=REPO))  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    elapsed = time.monotonic() - start
    assert procs[1].returncode == 7, outs[1][1][-2000:]
    assert "exiting in the middle of the step" in outs[1][0]
    assert procs[0].returncode not in (0, None), "the surviving rank must fail, not finish"
    assert "the step finished" not in outs[0][1]
    assert elapsed < 240, f"took {elapsed:.0f}s: the survivor should fail within the timeout"
