# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU against the trainer itself: the model shape from the same flags, the data order, and
tools/calibrate.py on a tiny grid (these import torch and megatron-core)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration.calibration import Calibration
from orchestration.workload import WorkloadGenerator, WorkloadSpec
from pipeweaver.generators import generate
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import step_microbatches, structure_of
from pipeweaver.semu.hardware import DEVICES, ClusterSpec
from pipeweaver.semu.model import flags_to_argv, load_model_config, model_from_flags
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.work import ModelCosts

REPO = Path(__file__).resolve().parents[2]
CPU_CONFIG = REPO / "scripts" / "configs" / "cpu-main.json"

_EXTENSIONS = {"embedding_params": 0, "add_bias_linear": True, "normalization": "LayerNorm"}


def _trainer_shape(flags: dict, world_size: int):
    from megatron.mllm.arguments import parse_arguments
    from megatron.mllm.config import mllm_config_from_args

    argv = flags_to_argv(flags) + ["--train-iters", "1", "--lr", "1e-3"]
    return mllm_config_from_args(parse_arguments(argv, world_size)).shape()


@pytest.mark.parametrize(
    "extra,world",
    [
        ({}, 2),
        ({"swiglu": True, "group-query-attention": True, "num-query-groups": 2, "bf16": True,
          "projector-type": "affine", "tensor-model-parallel-size": 2, "vision-hidden-size": 48,
          "audio-num-layers": 0, "ffn-hidden-size": 200}, 2),  # fmt: skip
    ],
)
def test_shape_matches_the_trainers_own(extra, world):
    flags = {**json.loads(CPU_CONFIG.read_text())["flags"], **extra}
    mine = model_from_flags(flags).shape
    theirs = _trainer_shape(flags, world)
    strip = lambda s: dataclasses.replace(s, **_EXTENSIONS)  # noqa: E731
    assert strip(mine.llm) == strip(theirs.llm)
    assert {k: strip(v) for k, v in mine.encoders.items()} == dict(theirs.encoders)


def test_calibrate_quick_grid_and_semu_reads_it(tmp_path):
    out = tmp_path / "cal.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "calibrate.py"), "--quick", "--output", str(out),
         "--modules", "llm", "--lengths", "8,16", "--packs", "1,2"],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cal = Calibration.load(out)
    assert set(cal.modules) == {"llm"}
    spec = load_model_config(CPU_CONFIG)
    costs = ModelCosts(spec)
    for module, t in cal.modules.items():
        assert min(t.const_s, t.linear_s, t.quadratic_s, t.per_sequence_s) >= 0
        assert t.linear_s > 0 or t.const_s > 0
        assert t.backward_ratio > 0 and t.head_s_per_token is not None
        # The measured activation bytes of a layer agree with the cost description's formula.
        analytic = costs.layer_activation_bytes(module, [100]) / 100
        assert 0.7 * analytic <= t.act_bytes_per_token <= 1.4 * analytic
    assert cal.hardware["peak_flops"] > 0 and 0 < cal.efficiency["compute"] <= 1
    assert {"sample_s", "feature_s_per_element", "optimizer_s_per_param"} <= set(cal.host)
    # SEMU runs on it (the encoders fall back to the analytical model).
    cluster = ClusterSpec(DEVICES["cpu"], 2, devices_per_node=2)
    semu = Semu(spec, cluster, cal)
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=1234, token_scale=1 / 32)
    enc = list(spec.shape.encoders)
    mbs = step_microbatches(gen.sample, 0, 2, 2, 4, enc)
    pl = Placement.baseline(1, spec.layers())
    res = semu.simulate_step([generate("none", pl, structure_of(x, enc)) for x in mbs], mbs)
    assert res.step_time_s > 0 and res.peak_activation_bytes[0] > 0
