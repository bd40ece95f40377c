# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The model SEMU costs: a run's model shape, parallel layout and batch settings.

:class:`ModelSpec` is what SEMU knows of a run: the model's
:class:`~orchestration.model_shape.ModelShape` (FLOPs, parameters, dtype), the parallel layout
and the batch, memory and workload settings. It is built from the trainer's own flags by the
trainer's own parser (``megatron.mllm.config_files``), never from a copy of its defaults. What
the model costs per compute is :mod:`pipeweaver.semu.work`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.workload_spec import DEFAULT_WORKLOAD


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

    clip_grad: float = 1.0
    """Gradient clipping norm (``--clip-grad``; 0 disables): the optimizer step's extra norm."""

    encoder_sub_microbatch_tokens: int = 0
    """Encoder tokens per sub-microbatch (``--encoder-sub-microbatch-tokens``; 0: one sub per
    encoder and microbatch)."""

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

    def layers(self) -> dict[str, int]:
        """Layers per module present."""
        out = {e: s.num_layers for e, s in self.shape.encoders.items()}
        out["llm"] = self.shape.llm.num_layers
        return out


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
