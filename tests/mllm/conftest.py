# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Shared fixtures of the trainer tests: one launch per world size runs every configuration."""

from __future__ import annotations

import pytest
from equivalence import FULL_SHAPES, TINY, run_configs, variable_workload
from launch import REPO

BALANCED = ["--post-balance", "auto"]
OVERLAP = ["--overlap-grad-reduce", "--ddp-bucket-size", "4000"]
# The dynamic pipeline with its schedule search, deterministic: a few rollouts, and a time
# budget no loaded host reaches, so every run and resume of a batch gets the same schedule.
SEARCH = ["--schedule-search-rollouts", "4", "--schedule-search-budget-ms", "60000"]
DYNAMIC = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic", *SEARCH]
PP2 = ["--pipeline-model-parallel-size", "2"]
LAYOUT_BALANCED = ["--pipeline-layout", "balanced"]
LAYOUT_COST = ["--pipeline-layout", "balanced-cost"]
RECOMPUTE = {
    "full-uniform": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1"],
    "full-block": ["--recompute-granularity", "full", "--recompute-method", "block",
                   "--recompute-num-layers", "1"],
    "selective": ["--recompute-granularity", "selective"],
}  # fmt: skip
"""Megatron's recompute settings the PP=2 baseline (``--pipeline-schedule megatron``) runs."""
CHUNKS_AUTO = [x for m in ("vision", "audio", "llm") for x in (f"--{m}-chunks-per-stage", "auto")]
"""Every module's chunks per stage chosen by the partitioner."""


def forcing_memory_limit_gb() -> float:
    """A ``--pipeline-memory-limit-gb`` for the PP=2 dynamic run of the equivalence tests that
    leaves half of greedy's peak activations (SEMU's, iteration 0) above the static bytes, so
    the search must recompute pairs to fit (``test_schedule_ahead`` checks that it does)."""
    from megatron.mllm.config_files import run_from_flags
    from megatron.mllm.prediction import run_cluster
    from pipeweaver.search.memory_limit import headroom_limit_gb
    from pipeweaver.semu.scenario import build_step
    from pipeweaver.semu.simulator import Semu

    spec = run_from_flags([*TINY, *DYNAMIC], 2).semu
    cluster = run_cluster(2, 2)
    schedules, mbs, _ = build_step(spec, cluster, schedule="dynamic", pad=False, iteration=0)
    step = Semu(spec, cluster).simulate_step(schedules, mbs, record_events=False)
    return headroom_limit_gb(0.5, step.static_bytes, step.peak_activation_bytes)


@pytest.fixture(scope="session")
def workload_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("workloads")


@pytest.fixture(scope="session")
def references(tmp_path_factory, workload_dir):
    """PP=1, DP=1, TP=1: one process sees the whole global batch, per workload."""
    runs = run_configs(
        tmp_path_factory.mktemp("world1"),
        1,
        {"default": [], "variable": variable_workload(workload_dir)},
    )
    FULL_SHAPES.update({name: g.shape for name, g in runs["default"][0].items()})
    return runs


@pytest.fixture(scope="session")
def reference(references):
    """The default workload's one-process reference."""
    return references["default"]


@pytest.fixture(scope="session")
def world2(tmp_path_factory, references, workload_dir):
    """Every 2-process configuration, one launch."""
    variable = variable_workload(workload_dir)
    configs = {
        "pp2-megatron": ["--pipeline-model-parallel-size", "2"],
        "dp2": [],
        "tp2": ["--tensor-model-parallel-size", "2"],
        "dp2-balanced": BALANCED,
        "dp2-balanced-no-overlap": [*BALANCED, "--no-overlap-exchanges"],
        # Megatron-LM's packed sequences: each rank's samples first-fit decreasing into the
        # packing limit, and the balanced LLM phase in the fewest microbatches within it.
        "dp2-packed": ["--pack-sequences"],
        "dp2-balanced-packed": [*BALANCED, "--pack-sequences"],
        "pp2-megatron-packed": ["--pipeline-model-parallel-size", "2", "--pack-sequences"],
        "pp2-dynamic-packed": [*DYNAMIC, "--pack-sequences"],
        "pp2-1f1b": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"],
        # Receives posted each ahead of its send (NCCL's default; gloo's posts them all first).
        "pp2-interleaved": ["--pipeline-model-parallel-size", "2", "--pipeline-schedule",
                            "interleaved", "--llm-chunks-per-stage", "2",
                            "--pipeline-receive-posting", "send"],  # fmt: skip
        "pp2-dynamic": DYNAMIC,
        "pp2-dynamic-subs-recompute": [*DYNAMIC, "--vision-chunks-per-stage", "1",
                                       "--llm-chunks-per-stage", "2",
                                       "--encoder-sub-microbatch-tokens", "40",
                                       "--pipeline-recompute", "all"],  # fmt: skip
        "variable-pp2-dynamic": [*variable, *DYNAMIC, "--encoder-sub-microbatch-tokens", "30"],
        "pp2-dynamic-memory-limit": [*DYNAMIC, "--pipeline-memory-limit-gb",
                                     f"{forcing_memory_limit_gb():.9f}"],  # fmt: skip
        # The partitioner on measured costs (layers by cost), subs cut by count: 2 units each.
        "variable-pp2-dynamic-auto": [*variable, *DYNAMIC, *CHUNKS_AUTO,
                                      "--encoder-sub-microbatch-size", "2", "--cost-calibration",
                                      str(REPO / "scripts/configs/calibration-cpu.json")],  # fmt: skip
        # Megatron's recompute flags (their activation memory is measured: memory-*), and
        # Megatron's schedules on DIP's parameter-balanced layout.
        **{f"memory-{name}": [*PP2, *flags] for name, flags in RECOMPUTE.items()},
        "pp2-1f1b-balanced": [*PP2, "--pipeline-schedule", "1f1b", *LAYOUT_BALANCED],
        "pp2-interleaved-balanced": [*PP2, "--pipeline-schedule", "interleaved",
                                     "--llm-chunks-per-stage", "2", *LAYOUT_BALANCED],  # fmt: skip
        # Stages of balanced cost (the model's FLOPs here), for 1F1B and the searched dynamic
        # pipeline, which then runs on Megatron's stages instead of cutting every module.
        "pp2-1f1b-balanced-cost": [*PP2, "--pipeline-schedule", "1f1b", *LAYOUT_COST],
        "pp2-dynamic-balanced-cost": [*DYNAMIC, *LAYOUT_COST],
        "pp2-dynamic-auto-layout": [*DYNAMIC, "--pipeline-layout", "auto"],
        "variable-dp2-balanced": [*variable, *BALANCED],
        "variable-dp2-lpt-node-wise": [*variable, "--post-balance", "lpt", "--node-wise-a2a",
                                       "--gpus-per-node", "1"],  # fmt: skip
    }
    return run_configs(tmp_path_factory.mktemp("world2"), 2, configs, tp={"tp2": 2})


@pytest.fixture(scope="session")
def world4(tmp_path_factory, references):
    """Every 4-process configuration, one launch (4 processes simulate 2 nodes x 2 ranks)."""
    configs = {
        "dp4-kk-node-wise": ["--post-balance", "kk", "--node-wise-a2a", "--gpus-per-node", "2"],
        "dp2-pp2-whole-samples": [*BALANCED, "--pipeline-model-parallel-size", "2"],
        "dp2-pp2-whole-samples-dynamic": [*BALANCED, *DYNAMIC],
        "dp2-pp2-whole-samples-packed": [*BALANCED, *DYNAMIC, "--pack-sequences"],
        # --overlap-grad-reduce in small buckets: megatron-core's 1F1B and the runtime each
        # declare a chunk's gradients final after its last backward (megatron.mllm.grad_overlap).
        "dp2-pp2-whole-samples-overlap": [*BALANCED, "--pipeline-model-parallel-size", "2",
                                          *OVERLAP],  # fmt: skip
        "dp2-pp2-whole-samples-dynamic-overlap": [*BALANCED, *DYNAMIC, *OVERLAP],
    }
    return run_configs(tmp_path_factory.mktemp("world4"), 4, configs)
