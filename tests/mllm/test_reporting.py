# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""TensorBoard and wandb writers (megatron.mllm.reporting): scalars, steps, ranks, extras."""

from __future__ import annotations

import builtins
import dataclasses
import glob
import json
import math
import sys

import pytest
from test_arguments import BASE

from megatron.mllm.arguments import ConfigError, parse_arguments
from megatron.mllm.reporting import MetricWriters, record_scalars
from megatron.mllm.run_config import RunConfig

WORLD = 4


def _record(i: int) -> dict:
    """An iteration's --metrics-jsonl record, as the trainer writes it, with a timers entry."""
    return {
        "iteration": i,
        "lm_loss": 6.0 - i,
        "iteration_time_s": 0.5,
        "grad_norm": None,
        "learning_rate": 1e-3 * i,
        "samples": 16,
        "tokens": 4000,
        "flops": 2e12,
        "imbalance": {"vision": 1.5, "llm": 1.25},
        "imbalance_balanced": {"vision": 1.0, "llm": 1.0},
        "bytes_moved": 1024,
        "algorithm": "auto",
        "timers": {
            "seconds": {"forward-backward": [0.25, 0.5, 0.75, 0.5]},
            "depth": {"forward-backward": 0},
            "collectives": {"all-to-all": {"wait": [0.0, 0.1, 0.2, 0.1]}},
        },
    }


@pytest.fixture(scope="module")
def run() -> RunConfig:
    """One parse (Megatron's parser costs seconds); tests replace the logger's fields."""
    args = parse_arguments(
        [*BASE, "--tensorboard-dir", "unused", "--wandb-project", "orchweave-test",
         "--wandb-exp-name", "reporting", "--tensorboard-log-interval", "2"],
        WORLD,
    )  # fmt: skip
    return RunConfig.from_args(args)


def _with(run: RunConfig, **logger) -> RunConfig:
    return dataclasses.replace(run, logger=dataclasses.replace(run.logger, **logger))


def test_megatrons_flags_land_in_the_logger_config(run):
    log = run.logger
    assert log.tensorboard_dir == "unused" and log.tensorboard_log_interval == 2
    assert log.wandb_project == "orchweave-test" and log.wandb_exp_name == "reporting"
    assert log.tensorboard_queue_size == 1000 and not log.log_timers_to_tensorboard


def test_scalars_flatten_skip_non_numbers_and_derive_throughput():
    s = record_scalars(_record(2), WORLD)
    assert s["lm_loss"] == 4.0 and s["imbalance/vision"] == 1.5
    assert s["imbalance_balanced/llm"] == 1.0 and s["bytes_moved"] == 1024
    assert "grad_norm" not in s and "algorithm" not in s and "iteration" not in s
    assert s["samples_per_s"] == 32 and s["tokens_per_s"] == 8000
    assert math.isclose(s["tflops_per_gpu"], 2e12 / 0.5 / WORLD / 1e12)
    assert not any(t.startswith("timers/") for t in s)
    t = record_scalars(_record(2), WORLD, timers=True)
    assert t["timers/forward-backward/max"] == 0.75 and t["timers/forward-backward/min"] == 0.25
    assert t["timers/forward-backward/mean"] == 0.5
    assert t["timers/collectives/all-to-all/wait/max"] == 0.2
    assert not any("depth" in k or "seconds" in k for k in t)


def test_tensorboard_scalars_and_steps_every_interval(run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _with(run, tensorboard_dir=str(tmp_path), wandb_project=None,
                log_timers_to_tensorboard=True)  # fmt: skip
    with MetricWriters.from_run(cfg, WORLD - 1, WORLD) as writers:
        assert writers.active
        for i in range(1, 6):
            writers.write(i, _record(i))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"lm_loss", "imbalance/vision", "tokens_per_s", "timers/forward-backward/max"} <= tags
    assert "grad_norm" not in tags
    loss = events.Scalars("lm_loss")
    assert [e.step for e in loss] == [2, 4]  # --tensorboard-log-interval 2
    assert [e.value for e in loss] == [4.0, 2.0]
    assert [e.value for e in events.Scalars("timers/forward-backward/max")] == [0.75, 0.75]


def test_timers_only_with_log_timers_to_tensorboard(run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _with(run, tensorboard_dir=str(tmp_path), wandb_project=None,
                tensorboard_log_interval=1)  # fmt: skip
    with MetricWriters.from_run(cfg, WORLD - 1, WORLD) as writers:
        writers.write(1, _record(1))
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "lm_loss" in tags and not any(t.startswith("timers/") for t in tags)


def _wandb_history(path: str) -> list[dict]:
    """The history rows of a wandb transaction log (LevelDB log framing of Record protos)."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, pos, buf, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            buf = b""
            if rec.WhichOneof("record_type") == "history":
                rows.append(
                    {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item}
                )  # fmt: skip
    return rows


def test_wandb_offline_run_holds_the_history(run, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = _with(run, tensorboard_dir=None, wandb_save_dir=str(tmp_path))
    writers = MetricWriters.from_run(cfg, WORLD - 1, WORLD)
    for i in range(1, 5):
        writers.write(i, _record(i))
    writers.close()
    runs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(runs) == 1
    rows = _wandb_history(glob.glob(f"{runs[0]}/run-*.wandb")[0])
    assert [r["_step"] for r in rows] == [2, 4]
    assert [r["lm_loss"] for r in rows] == [4.0, 2.0]
    assert rows[0]["imbalance/vision"] == 1.5 and rows[0]["samples_per_s"] == 32


def test_only_the_last_rank_writes(run, tmp_path):
    cfg = _with(run, tensorboard_dir=str(tmp_path / "tb"), wandb_project=None)
    writers = MetricWriters.from_run(cfg, 0, WORLD)
    assert not writers.active
    writers.write(2, _record(2))
    writers.close()
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize(
    "logger,module,extra",
    [
        ({"wandb_project": None}, "tensorboard", "tensorboard"),
        ({"tensorboard_dir": None}, "wandb", "wandb"),
    ],
)
def test_a_missing_extra_is_a_config_error_on_every_rank(run, monkeypatch, logger, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    for rank in (0, WORLD - 1):
        with pytest.raises(ConfigError, match=rf"pip install 'orchweave\[{extra}\]'"):
            MetricWriters.from_run(_with(run, **logger), rank, WORLD)


def test_a_failing_import_on_the_writing_rank_names_the_extra(run, tmp_path, monkeypatch):
    real = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("TensorBoard logging requires TensorBoard")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    cfg = _with(run, tensorboard_dir=str(tmp_path), wandb_project=None)
    with pytest.raises(ConfigError, match=r"^--tensorboard-dir needs the tensorboard package"):
        MetricWriters.from_run(cfg, WORLD - 1, WORLD)
