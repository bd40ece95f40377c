# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""tools/semu.py and the configs in scripts/configs, read by the trainer's parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron.mllm.arguments import ONE_REPLICA, ConfigError
from megatron.mllm.config_files import (
    find_config,
    flag_argv,
    load_run_config,
    run_from_flags,
    set_flags,
)
from pipeweaver.semu.hardware import DEVICES, ClusterSpec

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "scripts" / "configs"
KEYS = {"step_time_s", "bubble_ratio", "mfu", "peak_memory_bytes", "config"}


def _semu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "semu.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def _semu_in_process(args, capsys, monkeypatch) -> tuple[int, str, str]:
    """``tools/semu.py``'s main in this process (its start-up, megatron-core's import, is paid
    once by the suite, not once per case): exit status, stdout, stderr."""
    from megatron.mllm import logs
    from megatron.mllm.cli import semu

    monkeypatch.setattr(logs, "configure", lambda level: None)
    capsys.readouterr()
    try:
        status = semu.main(list(args))
    except SystemExit as e:  # argparse's errors
        status = e.code
    out = capsys.readouterr()
    return status, out.out, out.err


def test_cli_json_has_the_documented_keys(tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    proc = _semu(
        "--model", "cpu-main", "--cluster", "cpu-2ranks", "--set", "pipeline-model-parallel-size=2",
        "--json", "--trace", str(trace), "--png", str(png),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert KEYS <= set(out)
    assert len(out["peak_memory_bytes"]) == 2 and all(b > 0 for b in out["peak_memory_bytes"])
    assert out["step_time_s"] > 0 and 0 <= out["bubble_ratio"] < 1 and 0 < out["mfu"] < 1
    assert out["config"]["schedule"] == "1f1b" and out["config"]["pp"] == 2
    assert json.loads(trace.read_text())["traceEvents"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_text_summary_and_dynamic_layout(capsys, monkeypatch):
    status, out, err = _semu_in_process(
        ("--model", "cpu-main", "--cluster", "cpu-2ranks", "--set", "pipeline-model-parallel-size=2",
         "--schedule", "dataflow", "--encoder-sub-microbatch-tokens", "1"), capsys, monkeypatch,
    )  # fmt: skip
    assert status == 0, err
    assert "step time" in out and "interleaved placement" in out


def test_cli_resolves_the_trainers_layouts_as_the_trainer_does(capsys, monkeypatch):
    from megatron.mllm.layout_choice import choose_layout

    base = ("--model", "cpu-main", "--cluster", "cpu-2ranks", "--set",
            "pipeline-model-parallel-size=2", "--schedule", "dynamic", "--pad", "none")  # fmt: skip
    flags = set_flags({"pipeline-model-parallel-size": 2, "pipeline-schedule": "dynamic"})
    loaded = load_run_config("cpu-main", flags, world_size=2)
    expected = choose_layout(loaded.run, loaded.model, ClusterSpec.load(find_config("cpu-2ranks")))
    status, out, err = _semu_in_process((*base, "--set", "pipeline-layout=auto"), capsys,
                                        monkeypatch)  # fmt: skip
    assert status == 0, err
    assert f"({expected.layout} placement)" in out
    for given in (("--placement", "balanced-cost"), ("--set", "pipeline-layout=balanced-cost")):
        status, out, err = _semu_in_process((*base, *given), capsys, monkeypatch)
        assert status == 0, err
        assert "(balanced-cost placement)" in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (("--model", "nope", "--cluster", "cpu-2ranks"), "config not found"),
        (("--model", "cpu-main", "--cluster", "cpu-2ranks", "--set", "num-layers=3",
          "--set", "pipeline-model-parallel-size=2"), "not divisible"),  # fmt: skip
        (
            ("--model", "cpu-main", "--cluster", "cpu-2ranks", "--workload", "missing-spec"),
            "workload",
        ),
    ],
)
def test_cli_errors(args, needle, capsys, monkeypatch):
    status, _, err = _semu_in_process(args, capsys, monkeypatch)
    assert status == 2
    assert err.startswith("error:") and needle in err and err.count("\n") == 1, err


EXPECTED_PARAMS = {  # billions: the paper's names, within the stated assumptions
    "vlm-s": (11.5, 13.5),
    "vlm-m": (36, 39),
    "vlm-l": (93, 97),
    "t2v-s": (11, 13.5),
    "t2v-l": (59, 63),
    "omni-84b": (83, 85),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PARAMS))
def test_paper_configs_load(name):
    spec = load_run_config(CONFIGS / f"{name}.json", world_size=ONE_REPLICA).semu
    lo, hi = EXPECTED_PARAMS[name]
    assert lo <= spec.shape.total_params() / 1e9 <= hi
    assert spec.shape.params_dtype_bytes == 2 and spec.parallel.sequence_parallel


def test_cluster_configs_load():
    for path in CONFIGS.glob("*.json"):
        obj = json.loads(path.read_text())
        if "device" in obj and "num_devices" in obj:  # calibration files name a device too
            cl = ClusterSpec.from_json(obj, where=str(path))
            assert cl.device is DEVICES[obj["device"]] or cl.device.name == obj["device"]
    with pytest.raises(ValueError, match="unknown device"):
        ClusterSpec.from_json({"device": "tpu", "num_devices": 1})


def _spec(flags: dict):
    return run_from_flags(flag_argv(set_flags(flags))).semu


def test_model_flags_follow_megatron_defaults():
    # Megatron's validation needs a micro batch and --max-position-embeddings.
    required = {"micro-batch-size": 1, "max-position-embeddings": 64}
    spec = _spec({"num-layers": 2, "hidden-size": 96, "num-attention-heads": 4,
                  "seq-length": 64, "vocab-size": 1000, "swiglu": True, **required})  # fmt: skip
    assert spec.shape.llm.ffn_hidden_size == int((4 * 96 * 2 / 3) / 64) * 64
    assert spec.shape.llm.output_flops_per_token == 2 * 96 * 1024  # vocab padded to 128
    assert spec.shape.encoders["vision"].gated_mlp  # encoders follow --swiglu, as the trainer
    assert spec.shape.encoders["audio"].num_layers == 2  # OrchWeave's default
    with pytest.raises(ConfigError, match="--seq-length"):
        _spec({"num-layers": 2, "hidden-size": 8, "num-attention-heads": 2, "vocab-size": 9,
               **required})  # fmt: skip
