# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU against the trainer itself: the model configs as their descriptions state them, the
shape overrides, and tools/calibrate.py on a tiny grid (these import torch and megatron-core)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from megatron.mllm.arguments import ConfigError
from megatron.mllm.config_files import CONFIG_DIR, load_run_config
from orchestration.calibration import Calibration
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec
from pipeweaver.generators import generate
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import step_microbatches, structure_of
from pipeweaver.semu.hardware import DEVICES, ClusterSpec
from pipeweaver.semu.simulator import Semu
from pipeweaver.semu.work import ModelCosts

REPO = Path(__file__).resolve().parents[2]


class Module(NamedTuple):
    """A module as a description states it; None: not stated."""

    layers: int
    hidden: int
    ffn: int | None = None
    heads: int | None = None
    groups: int | None = None
    gated: bool | None = None
    causal: bool | None = None
    billions: float | None = None
    """Parameters, where the description names a count (within 5%). Names of the papers'
    models ("ViT 5B", "DiT 5B") are not counts: those models are sized only roughly so."""


class Described(NamedTuple):
    """A model config as its description states it."""

    world: int
    layout: tuple[int, int, int]
    """TP, PP, virtual stages per pipeline rank."""
    dtype_bytes: int
    seq_length: int
    global_batch: int
    modules: dict[str, Module]
    total_billions: float | None = None


# The modules of configs that differ only in layout or data (one model, two rows).
_DIP_T1_VLM = {
    "vision": Module(29, 1792, 15360, 16, gated=False, billions=2.0),
    "llm": Module(24, 4096, 11008, 32, 32, gated=True, billions=5.1)}  # fmt: skip
_T2V_XL = {
    "llm": Module(48, 6144, 24576, 48, causal=False, billions=30),
    "vision": Module(80, 8192, 29568, 64, 8, billions=72)}  # fmt: skip
_VLM_XL = {
    "vision": Module(48, 6144, 24576, 48, gated=False, billions=22),
    "llm": Module(96, 12288, 49152, 96, 96, gated=False, billions=175)}  # fmt: skip

DESCRIBED = {
    "cpu-main": Described(1, (1, 1, 1), 4, 256, 16, {
        "llm": Module(4, 64, heads=4), "vision": Module(2, 64), "audio": Module(2, 64)}),
    "dip-t1-lm7b": Described(8, (2, 4, 1), 2, 8192, 34, {
        "llm": Module(32, 4096, 11008, 32, 32, gated=True, billions=6.7)}),
    "dip-t1-vlm-dynamic": Described(8, (2, 4, 1), 2, 8192, 26, _DIP_T1_VLM),
    "dip-t1-vlm-static": Described(8, (2, 4, 1), 2, 8192, 25, _DIP_T1_VLM),
    "gpu-check": Described(1, (1, 1, 1), 2, 8192, 16, {
        "vision": Module(32, 1280, 3456, 16, gated=True, causal=False, billions=0.66),
        "llm": Module(16, 2048, 8192, 32, 8, billions=1.52)}, total_billions=2.18),
    "gpu-check-tiny": Described(1, (1, 1, 1), 4, 256, 8, {
        "vision": Module(2, 32, 64, 4, gated=True), "llm": Module(2, 32, 64, 4, 2)}),
    "omni-84b": Described(2560, (8, 4, 1), 2, 8192, 10240, {
        "llm": Module(80, 8192, billions=72),
        "vision": Module(45, 3200, 12800, 25, gated=False),
        "audio": Module(40, 3200, gated=False)}, total_billions=83.8),
    "slurm-example": Described(4, (2, 2, 1), 2, 8192, 512, {
        "llm": Module(32, 4096, 4 * 4096, 32), "vision": Module(32, 1280, 4 * 1280, 16),
        "audio": Module(32, 1280, 4 * 1280, 20)}),
    "t2v-xl": Described(3072, (8, 4, 2), 2, 9216, 1536, _T2V_XL),
    "t2v-xl-6k": Described(6144, (8, 8, 2), 2, 9216, 1536, _T2V_XL),
    "t2v-l": Described(64, (8, 8, 2), 2, 9216, 32, {
        "llm": Module(48, 6144, 24576, 48, causal=False, billions=30),
        "vision": Module(64, 5120, billions=32)}),
    "t2v-s": Described(16, (4, 4, 1), 2, 9216, 32, {
        "llm": Module(28, 3584, 10240, 28, causal=False), "vision": Module(32, 4096)}),
    "vlm-l": Described(64, (8, 8, 2), 2, 8192, 32, {
        "vision": Module(48, 6144, 24576, 48, gated=False, billions=22),
        "llm": Module(80, 8192, 29568, 64, 8, billions=72)}),
    "vlm-xl": Described(8192, (8, 8, 2), 2, 8192, 2048, _VLM_XL),
    "vlm-xl-16k": Described(16384, (8, 16, 2), 2, 8192, 2048, _VLM_XL),
    "vlm-m": Described(32, (8, 4, 2), 2, 8192, 32, {
        "vision": Module(63, 1792, gated=False),
        "llm": Module(64, 5120, 27648, 40, 8, billions=32)}),
    "vlm-s": Described(16, (4, 4, 2), 2, 8192, 32, {
        "vision": Module(63, 1792, 15360, 16, gated=False), "llm": Module(32, 4096, billions=8)}),
}  # fmt: skip
"""Every model config of ``scripts/configs``, as its ``description`` states it."""


def test_every_model_config_is_described():
    configs = {p.stem for p in CONFIG_DIR.glob("*.json") if "flags" in json.loads(p.read_text())}
    assert configs == set(DESCRIBED)


@pytest.mark.parametrize("name", sorted(DESCRIBED))
def test_semu_spec_is_the_model_its_description_states(name):
    want = DESCRIBED[name]
    spec = load_run_config(name, world_size=want.world).semu
    p, shape = spec.parallel, spec.shape
    assert (p.tensor, p.pipeline, p.llm_chunks_per_rank) == want.layout
    assert shape.params_dtype_bytes == want.dtype_bytes
    assert (spec.training.seq_length, spec.training.global_batch_size) == (
        want.seq_length,
        want.global_batch,
    )
    assert set(spec.layers()) == set(want.modules)
    for module, stated in want.modules.items():
        s = shape.module(module)
        got = Module(s.num_layers, s.hidden_size, s.ffn_hidden_size, s.num_attention_heads,
                     s.num_query_groups, s.gated_mlp, s.causal)  # fmt: skip
        for field in Module._fields[:-1]:
            if getattr(stated, field) is not None:
                assert getattr(got, field) == getattr(stated, field), (module, field)
        if stated.billions is not None:
            assert shape.module_params(module) / 1e9 == pytest.approx(stated.billions, rel=0.05)
    if want.total_billions is not None:
        assert shape.total_params() / 1e9 == pytest.approx(want.total_billions, rel=0.01)


def _config_with(tmp_path: Path, overrides: dict) -> Path:
    obj = json.loads((CONFIG_DIR / "cpu-main.json").read_text())
    path = tmp_path / "overridden.json"
    path.write_text(json.dumps({**obj, "shape_overrides": overrides}))
    return path


def test_shape_overrides_change_semus_shape_only(tmp_path):
    plain = load_run_config("cpu-main")
    loaded = load_run_config(
        _config_with(tmp_path, {"vision": {"gated_mlp": True}, "llm": {"causal": False}})
    )
    assert loaded.semu.shape is loaded.shape
    assert loaded.shape.encoders["vision"].gated_mlp and not loaded.shape.llm.causal
    assert loaded.shape.encoders["audio"] == plain.shape.encoders["audio"]
    # A gated MLP has a third matrix: SEMU counts its parameters.
    assert loaded.shape.module_params("vision") > plain.shape.module_params("vision")
    # The trainer builds the model of the flags, unchanged.
    assert loaded.model.shape() == plain.model.shape()


@pytest.mark.parametrize(
    "overrides,named",
    [({"vision": {"gated": True}}, "gated"), ({"video": {"causal": False}}, "video")],
)
def test_bad_shape_overrides_name_the_file(tmp_path, overrides, named):
    path = _config_with(tmp_path, overrides)
    with pytest.raises(ConfigError) as e:
        load_run_config(path)
    assert str(path) in str(e.value) and named in str(e.value)


def test_calibrate_quick_grid_and_semu_reads_it(tmp_path):
    out = tmp_path / "cal.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "calibrate.py"), "--quick", "--output", str(out),
         "--modules", "llm", "--lengths", "8,16", "--packs", "1,2"],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
        # This checkout's package, whichever checkout the environment installed.
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore",
             "PYTHONPATH": str(REPO)},  # fmt: skip
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cal = Calibration.load(out)
    assert set(cal.modules) == {"llm"}
    spec = load_run_config("cpu-main").semu
    costs = ModelCosts(spec)
    for module, t in cal.modules.items():
        assert min(t.const_s, t.linear_s, t.quadratic_s, t.per_sequence_s) >= 0
        # Some term carries a forward call's time. Which one is the fit's choice: on this tiny
        # grid (8-32 tokens per call) a loaded host's timings can go wholly to the chunk's or
        # the input layer's fixed cost, leaving the per-layer terms at zero.
        forward_terms = (t.const_s, t.linear_s, t.quadratic_s, t.per_sequence_s, t.chunk_const_s,
                         t.input_const_s, t.input_s_per_token or 0.0, t.head_const_s,
                         t.head_s_per_token or 0.0)  # fmt: skip
        assert max(forward_terms) > 0
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


@pytest.mark.multiproc
def test_parallel_stage_gives_every_figure_semu_reads_from_it():
    """The two-process stage (torchrun, 2 gloo ranks) measures the links, how two processes
    slow each other, and the runtime's transfers as a running step pays them: every figure
    SEMU charges per transfer, the posts above zero (a post is a system call at least)."""
    from megatron.mllm.calibration.parallel import measure_parallel

    par = measure_parallel(str(CONFIG_DIR / "cpu-main.json"), threads=1, reps=1)
    transfers = par["transfers"]
    assert set(transfers) == {
        "send_post_s", "send_wait_s", "recv_post_s", "recv_wait_s", "recv_post_ready_s",
        "recv_post_start_s", "transfer_compute_s",
    }  # fmt: skip
    posts = ("send_post_s", "recv_post_s", "recv_post_ready_s", "recv_post_start_s")
    assert min(transfers[k] for k in posts) > 0
    assert min(transfers.values()) >= 0 and max(transfers.values()) < 1.0
    comm = par["comm"]
    assert comm["p2p_latency_s"] >= 0 and comm["p2p_bandwidth"] > 0
    assert comm["allreduce_bandwidth"] > 0 and par["shared_node_slowdown"] >= 1.0
