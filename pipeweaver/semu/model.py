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


FSDP_SHARDING: tuple[str, ...] = ("none", "no_shard", "optim", "optim_grads", "optim_grads_params")
"""Values of :attr:`ParallelLayout.data_parallel_sharding` (Megatron-FSDP's strategies)."""


def receives_at_step_start(posting: str, gloo: bool) -> bool:
    """Whether the pipeline runtime posts every receive of a step when the step starts:
    ``posting`` is ``--pipeline-receive-posting`` (``step``, ``send``, or empty for the
    default, ``step`` on gloo and ``send`` on NCCL)."""
    return (posting or ("step" if gloo else "send")) == "step"


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

    data_parallel_sharding: str = "none"
    """Megatron-FSDP (``--use-megatron-fsdp --data-parallel-sharding-strategy``): ``none`` (not
    used), ``no_shard``, ``optim`` (optimizer states sharded over DP, as the distributed
    optimizer), ``optim_grads`` (and main gradients) or ``optim_grads_params`` (and weights:
    each layer's are gathered around its compute). The trainer refuses FSDP, so configs set it
    with ``parallel_overrides`` (or ``tools/semu.py --data-parallel-sharding-strategy``); its
    communication is :mod:`pipeweaver.semu.fsdp_comm`'s."""

    distributed_optimizer_instances: int = 1
    """Copies of the sharded state (``--num-distributed-optimizer-instances``): the DP ranks
    form this many groups of consecutive ranks; the optimizer states (and Megatron-FSDP's
    sharded gradients and weights: HSDP) are sharded within a group, and each group's shards
    are all-reduced across the copies (:mod:`pipeweaver.semu.dp_groups`). 1: over the whole
    DP group."""

    receive_posting: str = ""
    """When the runtime posts a stage's receives (``--pipeline-receive-posting``): ``step``
    (all at the step's start), ``send`` (each ahead of the send after it) or ``""``: the
    trainer's default, ``step`` on a CPU cluster (gloo) and ``send`` on GPUs."""

    pipeline_layout: str = ""
    """The trainer's ``--pipeline-layout`` when given (:data:`pipeweaver.semu.scenario.PLACEMENTS`;
    ``""``: each schedule's default, :func:`pipeweaver.semu.scenario.placement_kind`)."""

    def __post_init__(self) -> None:
        if self.data_parallel_sharding not in FSDP_SHARDING:
            raise ModelConfigError(
                f"data_parallel_sharding {self.data_parallel_sharding!r}: expected one of "
                f"{FSDP_SHARDING}"
            )
        instances = self.distributed_optimizer_instances
        if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
            raise ModelConfigError(
                f"--num-distributed-optimizer-instances must be an int >= 1, got {instances!r}"
            )

    def receives_at_step_start(self, device: str) -> bool:
        """Whether the runtime posts every receive at the step's start on ``device`` (SEMU's
        ``cpu`` device is the trainer's gloo)."""
        return receives_at_step_start(self.receive_posting, gloo=device == "cpu")

    def sharded(self, what: str) -> bool:
        """Whether ``optim``, ``grads`` or ``params`` are sharded over DP."""
        strategy = self.data_parallel_sharding
        if what == "optim":
            return self.distributed_optimizer or strategy.startswith("optim")
        return f"_{what}" in strategy

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


RECOMPUTE_GRANULARITIES: tuple[str, ...] = ("none", "full", "selective")
"""Megatron's ``--recompute-granularity`` values (``none``: the flag absent)."""

RECOMPUTE_METHODS: tuple[str, ...] = ("uniform", "block")
"""Megatron's ``--recompute-method`` values (full granularity)."""


@dataclass(frozen=True, slots=True)
class LayerRecompute:
    """Megatron's activation recompute inside every transformer block (``--recompute-*``).

    Each chunk is one megatron-core ``TransformerBlock``, so the rules apply per chunk: *full
    uniform* cuts the chunk's layers into groups of ``num_layers`` (the last one shorter) and
    keeps only each group's input; *full block* keeps only the input of each of the first
    ``num_layers`` layers and everything of the others; *selective* recomputes the core attention
    (its saved softmax statistics or score matrix are not kept). Every recomputed part runs its
    forward again in the backward.
    """

    granularity: str = "none"
    """``none``, ``full`` or ``selective`` (``--recompute-granularity``)."""

    method: str = "uniform"
    """Full granularity: ``uniform`` or ``block`` (``--recompute-method``)."""

    num_layers: int = 0
    """Full granularity: layers per group (uniform) or layers recomputed per chunk (block)
    (``--recompute-num-layers``)."""

    distribute_saved_activations: bool = False
    """Full granularity: each kept group input is split over TP
    (``--distribute-saved-activations``)."""

    def __post_init__(self) -> None:
        if self.granularity not in RECOMPUTE_GRANULARITIES:
            raise ModelConfigError(
                f"--recompute-granularity {self.granularity!r}: expected one of "
                f"{RECOMPUTE_GRANULARITIES[1:]}"
            )
        if self.granularity == "full":
            if self.method not in RECOMPUTE_METHODS:
                raise ModelConfigError(
                    f"--recompute-method {self.method!r}: expected one of {RECOMPUTE_METHODS}"
                )
            if self.num_layers < 1:
                raise ModelConfigError(
                    f"--recompute-num-layers must be >= 1 with --recompute-granularity full, got "
                    f"{self.num_layers}"
                )

    def plan(self, chunk_layers: int) -> tuple[int, int, int]:
        """What a chunk of ``chunk_layers`` layers keeps and reruns under full granularity.

        Returns:
            ``(stored_inputs, kept_layers, recomputed_layers)``: layer inputs kept in place of
            layers (one per checkpoint), layers whose activations are kept whole, and layers
            whose forward the backward runs again. Without full granularity:
            ``(0, chunk_layers, 0)``.
        """
        if self.granularity != "full":
            return 0, chunk_layers, 0
        if self.method == "uniform":
            return -(-chunk_layers // self.num_layers), 0, chunk_layers
        recomputed = min(self.num_layers, chunk_layers)
        return recomputed, chunk_layers - recomputed, recomputed

    def backward_peak(self, chunk_layers: int, input_bytes: float, layer_bytes: float) -> float:
        """Peak bytes of a chunk's layers while its backward reruns their forwards.

        The backward walks the checkpoints from the last to the first: while checkpoint ``g``
        is rebuilt, the stored inputs of checkpoints ``0..g`` and ``g``'s rebuilt layers are
        alive; the layers kept whole (block) and the head's tensors were freed before.

        Args:
            chunk_layers: layers of the chunk.
            input_bytes: one stored layer input.
            layer_bytes: what one layer keeps without recompute.
        """
        stored, _, recomputed = self.plan(chunk_layers)
        if not recomputed:
            return 0.0
        if self.method == "block":
            return stored * input_bytes + layer_bytes
        sizes = [min(self.num_layers, chunk_layers - g * self.num_layers) for g in range(stored)]
        return max((g + 1) * input_bytes + n * layer_bytes for g, n in enumerate(sizes))


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
    """Memory strategy of every stage's computes: ``none``, ``recompute`` (the runtime's
    ``--pipeline-recompute all``: each chunk's forward rerun whole) or ``offload``."""

    recompute: LayerRecompute = LayerRecompute()
    """Megatron's recompute inside each chunk; applies to computes whose strategy is ``none``
    (a chunk recomputed or offloaded whole keeps only its input anyway)."""

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
