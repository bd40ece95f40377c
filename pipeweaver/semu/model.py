# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The model SEMU costs, built from the trainer's own flags.

:func:`model_from_flags` reads the same flags as ``scripts/pretrain_mllm.py`` (Megatron's plus
OrchWeave's, with the same defaults) and derives the :class:`~orchestration.model_shape.ModelShape`
exactly as ``megatron.mllm.config.MLLMConfig.shape()`` does (tested against it), plus what a
simulator needs beyond FLOPs: dtype, parallel layout, batch sizes, recompute, vocabulary. What
the model costs per compute is :mod:`pipeweaver.semu.work`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.workload import DEFAULT_WORKLOAD

# Megatron-LM's and OrchWeave's defaults for the flags that change costs.
_DEFAULTS: dict[str, Any] = {
    "make_vocab_size_divisible_by": 128,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "num_virtual_stages_per_pipeline_rank": None,
    "sequence_parallel": False,
    "use_distributed_optimizer": False,
    "bf16": False,
    "fp16": False,
    "swiglu": False,
    "group_query_attention": False,
    "num_query_groups": 1,
    "normalization": "LayerNorm",
    "disable_bias_linear": False,
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "recompute_granularity": None,
    "micro_batch_size": 1,
    "global_batch_size": None,
    "max_position_embeddings": None,
    "seed": 1234,
    "workload": DEFAULT_WORKLOAD,
    "workload_seed": None,
    "workload_token_scale": 1.0,
    "vision_num_layers": 2,
    "vision_hidden_size": None,
    "vision_num_attention_heads": None,
    "vision_ffn_hidden_size": None,
    "vision_patch_size": 14,
    "audio_num_layers": 2,
    "audio_hidden_size": None,
    "audio_num_attention_heads": None,
    "audio_ffn_hidden_size": None,
    "audio_feature_dim": 128,
    "projector_type": "mlp",
    "ffn_hidden_size": None,
}
_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")


class ModelConfigError(ValueError):
    """A model config that cannot describe a model; names the flag."""


@dataclass(frozen=True)
class ParallelLayout:
    """How the model is split over devices (Megatron's flags)."""

    tensor: int = 1
    """Tensor-parallel size (``--tensor-model-parallel-size``)."""

    pipeline: int = 1
    """Pipeline-parallel size (``--pipeline-model-parallel-size``)."""

    llm_chunks_per_rank: int = 1
    """Virtual pipeline stages of the LLM (``--num-virtual-stages-per-pipeline-rank``)."""

    sequence_parallel: bool = False
    """Megatron's sequence parallelism: LayerNorm-region activations split over TP too."""

    distributed_optimizer: bool = False
    """Optimizer states sharded over data parallelism (``--use-distributed-optimizer``)."""

    def data(self, world_size: int) -> int:
        """Data-parallel size for a world size.

        Raises:
            ModelConfigError: TP x PP does not divide the world size.
        """
        model = self.tensor * self.pipeline
        if world_size % model != 0:
            raise ModelConfigError(
                f"--tensor-model-parallel-size {self.tensor} x --pipeline-model-parallel-size "
                f"{self.pipeline} = {model} does not divide the world size {world_size}"
            )
        return world_size // model


@dataclass(frozen=True)
class TrainingSetup:
    """Batch, precision and memory settings of the run."""

    micro_batch_size: int
    """Samples per microbatch."""

    global_batch_size: int | None
    """Samples per step over all DP ranks (None: micro batch x DP, Megatron's default)."""

    seq_length: int
    """LLM sequence length; with PP > 1 each microbatch is padded to micro batch x this."""

    grad_dtype_bytes: int = 4
    """Bytes of one main gradient (fp32 with bf16 training, Megatron's default)."""

    memory: str = "none"
    """Memory strategy of every stage: ``none``, or ``recompute`` (``--recompute-granularity
    full``)."""

    hidden_dropout: float = 0.1
    """Dropout after attention and MLP (keeps a 1-byte mask per element when > 0)."""

    attention_dropout: float = 0.1
    """Dropout on attention probabilities (a mask per score without flash attention)."""

    workload: str = DEFAULT_WORKLOAD
    """Workload spec or JSONL file (``--workload``)."""

    workload_seed: int = 1234
    """Seed of the sample stream (``--workload-seed``, default ``--seed``)."""

    workload_token_scale: float = 1.0
    """Token scale of the workload (``--workload-token-scale``)."""

    def global_batch(self, data_parallel: int) -> int:
        """Samples per step."""
        return self.global_batch_size or self.micro_batch_size * data_parallel

    def num_microbatches(self, data_parallel: int) -> int:
        """Microbatches per DP rank per step.

        Raises:
            ModelConfigError: the global batch is not a multiple of micro batch x DP.
        """
        gbs = self.global_batch(data_parallel)
        per = self.micro_batch_size * data_parallel
        if gbs % per != 0:
            raise ModelConfigError(
                f"--global-batch-size {gbs} is not a multiple of --micro-batch-size "
                f"{self.micro_batch_size} x data-parallel size {data_parallel}"
            )
        return gbs // per


@dataclass(frozen=True)
class ModelSpec:
    """Everything SEMU knows about the trained model and its run, from the trainer's flags."""

    shape: ModelShape
    """Sizes and FLOPs formula (as ``MLLMConfig.shape()``), plus dtype and parameter fields."""

    parallel: ParallelLayout
    """TP, PP, virtual stages, sequence parallelism, distributed optimizer."""

    training: TrainingSetup
    """Batch sizes, sequence length, memory strategy, workload."""

    projector_ffn: int = 0
    """Inner width of the MLP projectors (the LLM's FFN width; 0 for affine projectors)."""

    name: str = ""
    """Name of the config."""

    flags: Mapping[str, Any] = field(default_factory=dict)
    """The flags it was built from (normalised names)."""

    def layers(self) -> dict[str, int]:
        """Layers per module present."""
        out = {e: s.num_layers for e, s in self.shape.encoders.items()}
        out["llm"] = self.shape.llm.num_layers
        return out

    def argv(self) -> list[str]:
        """The flags as a trainer command line (``--num-layers 4 --bf16 ...``)."""
        return flags_to_argv(self.flags)


def _norm(key: str) -> str:
    return key.lstrip("-").replace("-", "_")


def flags_to_argv(flags: Mapping[str, Any]) -> list[str]:
    """Flags as a command line: ``True`` -> ``--flag``, ``False``/``None`` dropped."""
    argv = []
    for k, v in flags.items():
        name = "--" + _norm(k).replace("_", "-")
        if v is True:
            argv.append(name)
        elif v is False or v is None:
            continue
        else:
            argv += [name, str(v)]
    return argv


def model_from_flags(flags: Mapping[str, Any], name: str = "") -> ModelSpec:
    """Derive the model and run settings from trainer flags, with the trainer's defaults.

    Args:
        flags: flag name (``num-layers`` or ``num_layers``) -> value; ``true`` for switches.
        name: config name, for reports.

    Raises:
        ModelConfigError: a required flag is missing or a value cannot work.
    """
    f = dict(_DEFAULTS)
    f.update({_norm(k): v for k, v in flags.items()})
    for key in _REQUIRED:
        if f.get(key) is None:
            raise ModelConfigError(f"the model config needs --{key.replace('_', '-')}")

    def i(key: str) -> int:
        try:
            return int(f[key])
        except (TypeError, ValueError) as e:
            raise ModelConfigError(f"--{key.replace('_', '-')} must be an int") from e

    tp, pp = i("tensor_model_parallel_size"), i("pipeline_model_parallel_size")
    h, heads, layers = i("hidden_size"), i("num_attention_heads"), i("num_layers")
    if h % heads:
        raise ModelConfigError(
            f"--hidden-size {h} is not divisible by --num-attention-heads {heads}"
        )
    if layers % pp:
        raise ModelConfigError(
            f"--num-layers {layers} is not divisible by --pipeline-model-parallel-size {pp}"
        )
    gated = bool(f["swiglu"])
    ffn = f["ffn_hidden_size"]
    if ffn is None:
        # Megatron's default (megatron/training/arguments.py).
        ffn = int((4 * h * 2 / 3) / 64) * 64 if gated else 4 * h
    groups = i("num_query_groups") if f["group_query_attention"] else heads
    multiple = i("make_vocab_size_divisible_by") * tp
    vocab = -(-i("vocab_size") // multiple) * multiple
    max_pos = f["max_position_embeddings"] or i("seq_length")
    dtype = 2 if (f["bf16"] or f["fp16"]) else 4
    bias = not f["disable_bias_linear"]
    norm = str(f["normalization"])
    llm = TransformerShape(
        num_layers=layers,
        hidden_size=h,
        ffn_hidden_size=int(ffn),
        num_attention_heads=heads,
        num_query_groups=groups,
        gated_mlp=gated,
        causal=True,
        output_flops_per_token=2.0 * h * vocab,
        embedding_params=vocab * h + int(max_pos) * h,
        add_bias_linear=bias,
        normalization=norm,
    )
    encoders = {}
    input_dims = {"vision": 3 * i("vision_patch_size") ** 2, "audio": i("audio_feature_dim")}
    projector = str(f["projector_type"])
    for enc in ("vision", "audio"):
        n = i(f"{enc}_num_layers")
        if n < 0:
            raise ModelConfigError(f"--{enc}-num-layers must be >= 0")
        if n == 0:
            continue
        eh = int(f[f"{enc}_hidden_size"] or h)
        eheads = int(f[f"{enc}_num_attention_heads"] or heads)
        if eh % eheads:
            raise ModelConfigError(
                f"--{enc}-hidden-size {eh} is not divisible by --{enc}-num-attention-heads {eheads}"
            )
        effn = int(f[f"{enc}_ffn_hidden_size"] or 4 * eh)
        # As MLLMConfig.shape(): the MLP projector's FLOPs use the LLM's FFN width.
        proj = 2.0 * (eh * int(ffn) + int(ffn) * h) if projector == "mlp" else 2.0 * eh * h
        encoders[enc] = TransformerShape(
            num_layers=n,
            hidden_size=eh,
            ffn_hidden_size=effn,
            num_attention_heads=eheads,
            gated_mlp=gated,
            causal=False,
            input_flops_per_token=2.0 * input_dims[enc] * eh,
            output_flops_per_token=proj,
            add_bias_linear=bias,
            normalization=norm,
        )
    shape = ModelShape(llm=llm, encoders=encoders, params_dtype_bytes=dtype)
    vstages = f["num_virtual_stages_per_pipeline_rank"]
    parallel = ParallelLayout(
        tensor=tp,
        pipeline=pp,
        llm_chunks_per_rank=int(vstages) if vstages else 1,
        sequence_parallel=bool(f["sequence_parallel"]) and tp > 1,
        distributed_optimizer=bool(f["use_distributed_optimizer"]),
    )
    gbs = f["global_batch_size"]
    training = TrainingSetup(
        micro_batch_size=i("micro_batch_size"),
        global_batch_size=None if gbs is None else int(gbs),
        seq_length=i("seq_length"),
        grad_dtype_bytes=4,
        memory="recompute" if f["recompute_granularity"] == "full" else "none",
        hidden_dropout=float(f["hidden_dropout"]),
        attention_dropout=float(f["attention_dropout"]),
        workload=str(f["workload"]),
        workload_seed=int(f["workload_seed"] if f["workload_seed"] is not None else f["seed"]),
        workload_token_scale=float(f["workload_token_scale"]),
    )
    return ModelSpec(
        shape=shape,
        parallel=parallel,
        training=training,
        projector_ffn=int(ffn) if projector == "mlp" else 0,
        name=name,
        flags={_norm(k): v for k, v in flags.items()},
    )


def apply_shape_overrides(spec: ModelSpec, overrides: Mapping[str, Mapping[str, Any]]) -> ModelSpec:
    """Replace :class:`TransformerShape` fields per module.

    For models the trainer cannot build yet (e.g. a DiT backbone with bidirectional attention
    in the LLM's place, or GQA in an encoder): ``{"llm": {"causal": false}}``.

    Raises:
        ModelConfigError: an unknown module or field.
    """
    if not overrides:
        return spec
    shape = spec.shape
    llm = shape.llm
    encoders = dict(shape.encoders)
    names = {f.name for f in dataclasses.fields(TransformerShape)}
    for module, fields in overrides.items():
        bad = set(fields) - names
        if bad:
            raise ModelConfigError(f"shape_overrides.{module}: unknown fields {sorted(bad)}")
        if module == "llm":
            llm = dataclasses.replace(llm, **fields)
        elif module in encoders:
            encoders[module] = dataclasses.replace(encoders[module], **fields)
        else:
            raise ModelConfigError(f"shape_overrides names {module!r}, which the model lacks")
    return dataclasses.replace(spec, shape=dataclasses.replace(shape, llm=llm, encoders=encoders))


def load_model_config(
    path: str | os.PathLike, set_flags: Mapping[str, Any] | None = None
) -> ModelSpec:
    """Read a model config.

    The file is ``{"name": ..., "description": ..., "flags": {...}, "shape_overrides": {...}}``:
    ``flags`` are the trainer's, ``shape_overrides`` optional (:func:`apply_shape_overrides`).

    Args:
        path: the JSON file.
        set_flags: flags overriding the file's (``--set`` on the command line).

    Raises:
        ModelConfigError: missing file, malformed JSON, or bad flags, naming the file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelConfigError(f"model config not found: {path}")
    with open(path, encoding="utf-8") as fh:
        try:
            obj = json.load(fh)
        except json.JSONDecodeError as e:
            raise ModelConfigError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("flags"), dict):
        raise ModelConfigError(f"{path}: a model config is an object with a 'flags' object")
    flags = dict(obj["flags"])
    flags.update(set_flags or {})
    try:
        spec = model_from_flags(flags, name=str(obj.get("name", os.path.basename(path))))
        return apply_shape_overrides(spec, obj.get("shape_overrides", {}))
    except (ModelConfigError, TypeError) as e:
        raise ModelConfigError(f"{path}: {e}") from e
