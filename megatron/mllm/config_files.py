# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Run configs on disk (``scripts/configs/*.json``): trainer flags, read by the trainer's parser.

A model config is a list of trainer flags, each as it would be typed on the command line::

    {"name": "vlm-s", "description": "...",
     "flags": ["--num-layers 32", "--hidden-size 4096", "--swiglu", "--bf16"],
     "shape_overrides": {"vision": {"gated_mlp": false}}}

:func:`load_run_config` parses them with :func:`megatron.mllm.arguments.parse_arguments`, so a
config means exactly what the same flags mean to ``scripts/pretrain_mllm.py`` (Megatron's
defaults and checks, OrchWeave's defaults and checks), and :func:`semu_model_spec` derives what
SEMU simulates from the same typed configs and ``MLLMConfig.shape()``. ``shape_overrides``
(optional) replaces fields of a module's ``TransformerShape`` for models the trainer cannot
build yet (an ungated ViT beside a SwiGLU LLM, a DiT in the LLM's place).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from megatron.mllm.arguments import ConfigError, add_mllm_args, parse_arguments
from megatron.mllm.config import MLLMConfig, mllm_config
from megatron.mllm.run_config import RunConfig
from orchestration.model_shape import ModelShape
from pipeweaver.semu.model import (
    LayerRecompute,
    ModelSpec,
    ParallelLayout,
    TrainingSetup,
    apply_shape_overrides,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "scripts" / "configs"
"""Where configs are found by name (a checkout's ``scripts/configs``)."""


@dataclass
class LoadedConfig:
    """A run config file, parsed."""

    name: str
    """The config's name."""

    run: RunConfig
    """The run, as the trainer would configure it."""

    model: MLLMConfig
    """The model the trainer would build."""

    shape: ModelShape
    """``model.shape()`` with the file's ``shape_overrides`` applied."""

    semu: ModelSpec
    """What SEMU simulates."""

    argv: list[str]
    """The flags, as one command line."""


def find_config(name_or_path: str | os.PathLike) -> Path:
    """A config file by path, or by name in ``scripts/configs`` (``vlm-s``, ``h800-16``).

    Raises:
        ConfigError: neither exists.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    named = CONFIG_DIR / f"{name_or_path}.json"
    if named.is_file():
        return named
    known = sorted(p.stem for p in CONFIG_DIR.glob("*.json"))
    raise ConfigError(f"config not found: {name_or_path} (not a file, and not one of {known})")


def flag_argv(flags: Sequence[str]) -> list[str]:
    """A config's flags (``"--num-layers 4"`` each) as one argument vector."""
    return [token for flag in flags for token in shlex.split(flag)]


def load_run_config(
    name_or_path: str | os.PathLike, extra_flags: Sequence[str] = (), world_size: int = 1
) -> LoadedConfig:
    """Read a config and parse its flags as the trainer would.

    Args:
        name_or_path: the JSON file, or its name in ``scripts/configs``.
        extra_flags: flags after the file's (later flags win, as on a command line), e.g.
            ``["--pipeline-model-parallel-size 2"]``.
        world_size: processes (GPUs) of the run: fixes the data-parallel size;
            :data:`~megatron.mllm.arguments.ONE_REPLICA` for one model replica (DP = 1).

    Raises:
        ConfigError: missing or malformed file, or flags that cannot work, naming the file.
    """
    path = find_config(name_or_path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from e
    flags = obj.get("flags") if isinstance(obj, dict) else None
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ConfigError(f"{path}: a run config is an object whose 'flags' is a list of strings")
    try:
        return run_from_flags(
            flag_argv([*flags, *extra_flags]),
            world_size,
            name=str(obj.get("name", path.stem)),
            shape_overrides=obj.get("shape_overrides", {}),
            parallel_overrides=obj.get("parallel_overrides", {}),
        )
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e


def run_from_flags(argv: Sequence[str], world_size: int = 1, name: str = "",
                   shape_overrides: Mapping[str, Mapping[str, Any]] | None = None,
                   parallel_overrides: Mapping[str, Any] | None = None
                   ) -> LoadedConfig:  # fmt: skip
    """Parse trainer flags as :func:`load_run_config` does, without a file.

    ``parallel_overrides`` replaces fields of SEMU's ``ParallelLayout`` for what the trainer
    refuses to run (``{"data_parallel_sharding": "optim_grads_params"}``: Megatron-FSDP).

    Raises:
        ConfigError: flags that cannot work.
    """
    argv = list(argv)
    try:
        run = RunConfig.from_args(parse_arguments(argv, world_size))
    except SystemExit as e:  # argparse has printed the usage error
        raise ConfigError(f"the flags do not parse: {' '.join(argv)}") from e
    model = mllm_config(run)
    try:
        semu = apply_shape_overrides(semu_model_spec(run, model, name), shape_overrides or {})
        if parallel_overrides:
            fields = {f.name for f in dataclasses.fields(ParallelLayout)}
            unknown = sorted(set(parallel_overrides) - fields)
            if unknown:
                raise ConfigError(f"parallel_overrides: unknown fields {unknown}")
            parallel = dataclasses.replace(semu.parallel, **parallel_overrides)
            semu = dataclasses.replace(semu, parallel=parallel)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    return LoadedConfig(name, run, model, semu.shape, semu, argv)


def semu_model_spec(run: RunConfig, model: MLLMConfig, name: str = "") -> ModelSpec:
    """SEMU's description of a run: the trainer's model shape, layout and memory settings."""
    lang = model.language
    tp = run.parallel.tensor
    return ModelSpec(
        shape=model.shape(),
        parallel=ParallelLayout(
            tensor=tp,
            pipeline=run.parallel.pipeline,
            llm_chunks_per_rank=_llm_chunks_per_rank(run, lang),
            sequence_parallel=bool(lang.sequence_parallel) and tp > 1,
            # As Megatron's flag asks (the trainer shards the optimizer state the same way).
            distributed_optimizer=bool(run.optimizer.use_distributed_optimizer),
            distributed_optimizer_instances=int(run.ddp.num_distributed_optimizer_instances),
            pipeline_layout=run.pipeline.pipeline_layout or "",
            receive_posting=run.pipeline.pipeline_receive_posting or "",
        ),
        training=TrainingSetup(
            micro_batch_size=run.micro_batch_size,
            global_batch_size=run.global_batch_size,
            seq_length=run.seq_length,
            grad_dtype_bytes=4,
            memory="recompute" if run.pipeline.pipeline_recompute == "all" else "none",
            recompute=layer_recompute(lang),
            hidden_dropout=float(lang.hidden_dropout),
            attention_dropout=float(lang.attention_dropout),
            workload=run.workload.workload,
            workload_seed=run.workload.workload_seed,
            workload_token_scale=run.workload.workload_token_scale,
            clip_grad=float(run.optimizer.clip_grad),
            encoder_sub_microbatch_tokens=run.pipeline.encoder_sub_microbatch_tokens,
        ),
        projector_ffn=model.language.ffn_hidden_size if model.projector_type == "mlp" else 0,
        name=name,
    )


def _llm_chunks_per_rank(run: RunConfig, language) -> int:
    """The LLM's chunks per pipeline rank in Megatron's schedules: megatron-core's virtual
    stages, or the runtime's ``--llm-chunks-per-stage`` under ``--pipeline-schedule
    interleaved`` (and ``dynamic`` on a layout of Megatron's stages)."""
    if language.virtual_pipeline_model_parallel_size:
        return language.virtual_pipeline_model_parallel_size
    p = run.pipeline
    if p.pipeline_schedule == "interleaved" or (
        p.pipeline_schedule == "dynamic" and p.layout != "interleaved"
    ):
        return int(p.llm_chunks_per_stage)
    return 1


def layer_recompute(language) -> LayerRecompute:
    """Megatron's ``--recompute-*`` flags as the LLM's megatron-core config holds them (every
    chunk's config is a copy of it, so the encoders recompute alike)."""
    return LayerRecompute(
        granularity=language.recompute_granularity or "none",
        method=language.recompute_method or "uniform",
        num_layers=language.recompute_num_layers or 0,
        distribute_saved_activations=bool(language.distribute_saved_activations),
    )


@functools.lru_cache(maxsize=1)
def trainer_flag_names() -> frozenset[str]:
    """Every long option of the trainer's parser (Megatron's and OrchWeave's), e.g.
    ``"--num-layers"``."""
    from megatron.mllm import cpu_shim

    cpu_shim.apply()
    from megatron.training.arguments import add_megatron_arguments

    parser = add_mllm_args(add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False)))
    return frozenset(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def check_flag_name(flag: str, where: str) -> None:
    """Raise unless ``flag`` (``"--num-layers"``) is one of the trainer's options.

    Args:
        flag: the option, with its dashes.
        where: what gave it, first in the message (e.g. ``"--set num_layers"``).

    Without this, Megatron's parser prints its own usage error before ours: two error lines,
    and the closest valid names are not suggested.

    Raises:
        ConfigError: naming the flag, and the trainer's closest option names.
    """
    known = trainer_flag_names()
    if flag in known:
        return
    close = difflib.get_close_matches(flag, sorted(known), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"{where}: the trainer has no flag {flag}{hint}")


def set_flags(pairs: Mapping[str, Any]) -> list[str]:
    """``{"pipeline-model-parallel-size": 2, "bf16": True}`` as flags for ``extra_flags``.

    Raises:
        ConfigError: a key that is not one of the trainer's flags (:func:`check_flag_name`).
    """
    out = []
    for key, value in pairs.items():
        flag = "--" + key.lstrip("-").replace("_", "-")
        check_flag_name(flag, f"--set {key}")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            out.append(f"{flag} {shlex.quote(str(value))}")
    return out
