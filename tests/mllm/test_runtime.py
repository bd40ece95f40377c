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


STRATEGY_FUZZED = 6
"""Random valid schedules mixing every strategy per pair, selective and first-n included."""


@pytest.fixture(scope="module")
def strategy_runs(tmp_path_factory):
    """The runtime's 1F1B order at PP=2 (each LLM and encoder chunk 2 layers) with every pair
    under one strategy at a time, fuzzed orders mixing them, and the memory ILP's choice among
    them under a limit (runtime_worker.py strategies); per run, the ranks' gradients merged,
    the loss and each rank's peak of saved activation bytes."""
    out = tmp_path_factory.mktemp("strategies")
    flags = [*TINY, "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]
    proc = check(torchrun(2, WORKER, ["strategies", str(out), str(STRATEGY_FUZZED), *flags],
                          timeout=600))  # fmt: skip
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    runs = {}
    for name in ranks[0]:
        grads = {}
        for r in ranks:
            grads.update(r[name]["grads"])
        loss = next(r[name]["loss"] for r in ranks if r[name]["loss"] is not None)
        runs[name] = (grads, loss, [r[name]["peak"] for r in ranks])
    return proc.stdout, runs


def test_selective_and_first_n_layers_per_pair_learn_what_one_process_learns(
    strategy_runs, reference
):
    stdout, runs = strategy_runs
    # Each uniform run ran what it says on both ranks; the fuzzed ones and the plan mixed them.
    assert stdout.count("ran selective with ['selective']") == 2
    assert stdout.count("ran layers1 with ['layers1']") == 2
    assert stdout.count("planned strategies ['layers1', 'none', 'recompute', 'selective']") == 2
    ref_grads, _, ref_loss = reference
    assert len(runs) == 4 + STRATEGY_FUZZED + 1
    for name, (grads, loss, _) in runs.items():
        assert set(grads) == set(ref_grads), name
        assert float((loss - ref_loss).abs().max() / ref_loss.abs().max()) <= 1e-5, name
        for key, g in grads.items():
            ref = ref_grads[key]
            rel = float((g - ref).norm() / ref.norm().clamp_min(1e-30))
            assert rel <= 1e-5, f"{name} {key}: relative gradient difference {rel:.2e}"
    # Saving memory is real: selective and the first layer lower every rank's peak; whole-chunk
    # recompute rebuilds everything in the backward, so on the last stage (one microbatch at a
    # time) it only matches keeping everything.
    peak = {name: runs[name][2] for name in ("none", "selective", "layers1", "recompute")}
    for name in ("selective", "layers1"):
        assert all(p < q for p, q in zip(peak[name], peak["none"])), (name, peak)
    assert peak["layers1"] < peak["selective"] and peak["recompute"][0] < peak["layers1"][0]


@pytest.mark.parametrize("strategy", ["none", "selective", "layers1", "recompute"])
def test_semu_activation_memory_of_each_per_pair_strategy_matches_the_run(strategy, strategy_runs):
    """SEMU's peak of activation bytes for the run's 1F1B order with every pair under one
    strategy, against the bytes autograd kept in the run (within 10% per rank)."""
    from megatron.mllm.config_files import run_from_flags
    from megatron.mllm.prediction import run_cluster
    from pipeweaver.ir import Memory
    from pipeweaver.lowering import lower
    from pipeweaver.schedule import Schedule
    from pipeweaver.semu.scenario import build_step
    from pipeweaver.semu.simulator import Semu

    measured = strategy_runs[1][strategy][2]
    flags = [*TINY, "--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]
    spec = run_from_flags(flags, 2).semu
    cluster = run_cluster(2, 2)
    schedules, mbs, _ = build_step(spec, cluster, schedule="1f1b", pad=False, iteration=0)
    memory, layers = (Memory.LAYERS, 1) if strategy == "layers1" else (Memory(strategy), 0)
    s = schedules[0]
    order = tuple(tuple(a.with_memory(memory, layers) for a in s.computes(r))
                  for r in range(s.num_ranks))  # fmt: skip
    planned = lower(Schedule(s.placement, s.structure, order, s.name))
    step = Semu(spec, cluster).simulate_step([planned], mbs, record_events=False)
    for rank, (semu, run) in enumerate(zip(step.peak_activation_bytes, measured)):
        assert abs(semu / run - 1) <= 0.10, f"rank {rank}: SEMU {semu:.0f} B, run {run} B"


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
