# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's run configuration: typed dataclasses, the one source of its flags.

Each dataclass below is both documentation and command line: megatron-training's
``ArgumentGroupFactory`` turns its fields into an argparse group of Megatron's parser (field
``workload_token_scale`` is ``--workload-token-scale``, its docstring its help), as Megatron-LM
builds its groups from ``megatron.training.config``. :meth:`RunConfig.from_args` instantiates
them with Megatron's and megatron-core's config dataclasses into one typed :class:`RunConfig`,
through which the trainer, SEMU and the tools read a run (``megatron.mllm.config_files`` builds
it from a ``scripts/configs`` file). Pure Python; parsed and checked by ``arguments``.
"""

# No ``from __future__ import annotations``: ArgumentGroupFactory reads the field types.
import dataclasses
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Mapping

from orchestration.workload import PHASES
from orchestration.workload_spec import DEFAULT_WORKLOAD

AUTO = "auto"
"""The value of a partitioner flag (``--*-chunks-per-stage``, ``--encoder-sub-microbatch-size``)
that lets the partitioner choose."""

PipelineLayout = Literal["baseline", "balanced", "balanced-cost", "interleaved", "auto"]
"""The values of ``--pipeline-layout``."""

ENCODER_NAMES: tuple[str, ...] = tuple(p for p in PHASES if p != "llm")
"""The encoders the model can have, in the order a sample flows through them."""


@dataclass(kw_only=True)
class WorkloadConfig:
    """OrchWeave: the workload a run trains on."""

    workload: str = DEFAULT_WORKLOAD
    """Workload spec (path or built-in name, e.g. omni-three-modality) or a JSONL file of
    sample metadata."""

    workload_seed: int | None = None
    """Seed of the generated sample stream and payloads. Default: --seed."""

    workload_token_scale: float = 1.0
    """Multiply every token count of the workload by this factor (each rounded, at least 1), to
    run a realistic mix on a small model."""

    synthetic_num_classes: int = 16
    """Hidden classes of synthetic images/audio; the text after an item names its class, so the
    LM loss can only reach its floor by reading the encoders."""

    overlong_samples: Literal["error", "truncate", "drop"] = "error"
    """A sample longer than --seq-length: stop with an error naming it (error), cut its text
    from the end, keeping its first and last token and every item whole (truncate), or skip it
    (drop). An item that alone does not fit is always an error. The log line counts the
    samples truncated or dropped over all data-parallel ranks."""

    pack_sequences: bool = False
    """Megatron-LM's packed sequences (the strong baseline): each DP rank's samples of an
    iteration packed first-fit decreasing into microbatches of at most --micro-batch-size x
    --seq-length LLM tokens, not --micro-batch-size samples each; with --post-balance each
    rank's LLM phase (PP=1) or DP group (PP>1) forms the fewest microbatches within that limit."""

    prompt_format: Literal["caption", "chat"] = "caption"
    """Real data (--data-path): the text template. caption: <s> TEXT </s>, a caption's item
    half-way through its text; chat: user and assistant turns in the tokenizer's <|user|>,
    <|assistant|>, <|end|> tokens, the loss scoring only the assistant's replies and the <|end|>
    closing each. An <image> or <audio> in a text places its item there."""


@dataclass(kw_only=True)
class EncoderArgs:
    """OrchWeave: one encoder's sizes; field ``num_layers`` of the vision encoder is the flag
    ``--vision-num-layers``."""

    num_layers: int = 2
    """Transformer layers of this encoder (0: the model has no such encoder)."""

    hidden_size: int | None = None
    """Hidden size of this encoder. Default: --hidden-size."""

    num_attention_heads: int | None = None
    """Attention heads of this encoder. Default: --num-attention-heads."""

    ffn_hidden_size: int | None = None
    """MLP hidden size of this encoder. Default: 4 x its hidden size."""


@dataclass(kw_only=True)
class MultimodalConfig:
    """OrchWeave: encoder inputs and projectors."""

    vision_patch_size: int = 14
    """Pixels per patch side; each vision token is a 3 x p x p patch."""

    audio_feature_dim: int = 128
    """Features per audio frame (mel bins) fed to the audio encoder."""

    projector_type: Literal["mlp", "affine"] = "mlp"
    """Encoder-to-LLM projector (megatron-core MultimodalProjector)."""

    image_tile_size: int = 448
    """Real images (--data-path): pixels per side of an InternVL-style tile; each tile (and the
    thumbnail of a multi-tile image) is one vision-encoder unit of (tile / patch)^2 patches."""

    image_max_tiles: int = 6
    """Real images: most tiles per image (the grid closest to its aspect ratio)."""

    image_preprocess: Literal["tile", "dynamic"] = "tile"
    """Real images: InternVL-style tiles (tile), or Qwen2-VL-style dynamic resolution (dynamic:
    the image resized, aspect kept, to multiples of 2 x --vision-patch-size within
    --min-pixels/--max-pixels, one vision-encoder unit of all its patches)."""

    min_pixels: int = 3136
    """--image-preprocess dynamic: smallest area (pixels) of a resized image (56 x 56,
    Qwen2-VL's default)."""

    max_pixels: int = 50176
    """--image-preprocess dynamic: largest area (pixels) of a resized image (224 x 224, for the
    CPU demo; Qwen2-VL's default is 28 x 28 x 1280)."""


@dataclass(kw_only=True)
class PostBalanceConfig:
    """OrchWeave: batch post-balancing across data-parallel ranks (OrchMLLM)."""

    post_balance: Literal["none", "lpt", "kk", "auto"] = "none"
    """Re-balance every iteration's work across data-parallel ranks after loading: per phase
    (each encoder, then the LLM) with PP=1, whole samples across DP groups with PP>1. lpt/kk:
    greedy or Karmarkar-Karp plus a refinement pass; auto: the best of all within a small work
    budget. none: upstream Megatron."""

    balance_phases: list[str] = field(
        default_factory=lambda: list(PHASES), metadata={"argparse_meta": {"choices": PHASES}}
    )
    """Phases to balance with PP=1; the others keep the loader's assignment. Default: all."""

    node_wise_a2a: bool = False
    """Move data with the node-wise all-to-all (one message per node pair) instead of one flat
    all-to-all."""

    gpus_per_node: int | None = None
    """Ranks per node, for node-aware placement and --node-wise-a2a. Default: $LOCAL_WORLD_SIZE
    (set by torchrun), else the visible GPUs, else 8."""

    check_plan_digest: bool = field(
        default=True, metadata={"argparse_meta": {"arg_names": ["--no-check-plan-digest"]}}
    )
    """Compare the balance plan's digest across DP ranks every iteration;
    --no-check-plan-digest skips the comparison."""

    plan_ahead: bool = field(
        default=True, metadata={"argparse_meta": {"arg_names": ["--no-plan-ahead"]}}
    )
    """Plan the next iteration in a background thread while this one runs (its metadata is
    gathered one iteration early, with the plan digest riding on that gather);
    --no-plan-ahead plans every iteration at the start of its step."""

    overlap_exchanges: bool = field(
        default=True, metadata={"argparse_meta": {"arg_names": ["--no-overlap-exchanges"]}}
    )
    """PP = 1: run the encoder outputs' exchange and their gradients' beside the LLM
    microbatches that need no other rank's outputs (those run first, then the others, then
    the rest of the first); --no-overlap-exchanges waits for each exchange where it starts and
    runs the microbatches in the planner's order."""

    cost_fit: bool = field(
        default=True, metadata={"argparse_meta": {"arg_names": ["--no-cost-fit"]}}
    )
    """Per-phase balancing (PP = 1): fit the cost model's coefficients of every phase, and the
    all-to-all's latency and bandwidth, to the measured per-rank times online, and keep a
    phase's ordinary assignment when its predicted gain does not pay for its exchanges;
    --no-cost-fit plans with the starting model (FLOPs, or --cost-calibration) throughout."""

    cost_fit_warmup: int = 8
    """Iterations measured before the fitted costs replace the starting model."""

    cost_fit_window: int = 64
    """Recent iterations the cost fit is computed over."""

    post_balance_guard_interval: int = 256
    """Measure the balanced step against Megatron's in the run (a probe of 24 iterations from
    iteration 9, balancing in alternate blocks of 4) and keep balancing until the next probe,
    this many iterations after the last one started, only where it measured at least 1%
    faster; else run Megatron's step (its assignment), with nothing planned or moved. At PP > 1
    with the schedule search's guard the two probe in turns (this one from iteration 33; the
    two intervals must then be equal). 0 balances every iteration."""

    post_balance_alternate: int = 0
    """For side-by-side measurement (per-phase balancing, and whole samples at PP > 1):
    alternate blocks of this many iterations between the balanced step and Megatron's
    assignment for the whole run, in place of the
    guard (tools/bench/post_balance_cpu.py runs two runs of opposite phase, so that every batch
    runs once each way). 0: off."""

    post_balance_alternate_first: Literal["balanced", "megatron"] = "balanced"
    """With --post-balance-alternate, which step runs the first block."""

    post_balance_token_caps: list[str] = field(
        default_factory=list, metadata={"argparse_meta": {"metavar": "PHASE=TOKENS"}}
    )
    """Largest summed tokens a rank may get in a phase (memory), e.g. vision=8192 llm=16384. A
    single item larger than its cap is an error naming the sample."""

    cost_calibration: str | None = None
    """Calibration JSON of measured per-layer times (tools/calibrate.py) for the balancer's cost
    model and SEMU's step prediction. Default: costs from the model's FLOPs (and SEMU's
    analytic device model)."""

    strict_calibration: bool = False
    """Refuse a --cost-calibration whose recorded host probe differs from this host's by more
    than 10%, instead of warning and scaling its times by the measured factor."""

    @property
    def token_caps(self) -> dict[str, int]:
        """``--post-balance-token-caps`` as phase -> tokens (checked by the argument parser)."""
        return {p: int(v) for p, _, v in (c.partition("=") for c in self.post_balance_token_caps)}


@dataclass(kw_only=True)
class PipelineConfig:
    """OrchWeave: the pipeline runtime (PipeWeaver/DIP)."""

    pipeline_schedule: Literal["megatron", "1f1b", "interleaved", "dynamic"] = "megatron"
    """megatron: megatron-core's own engine (encoders on stage 0, fixed padded shapes). 1f1b /
    interleaved: the same orders in OrchWeave's schedule IR, run by its runtime (no padding).
    dynamic: a new greedy dual-queue (or searched) order every batch."""

    pipeline_layout: PipelineLayout | None = None
    """Where the layers live (runtime schedules). baseline: Megatron's LLaVA layout, encoders
    whole on stage 0. balanced: every layer, encoders first, in pipeline-size x K consecutive
    stages of balanced parameters (DIP's Megatron baseline); balanced-cost: of balanced cost in
    the workload's first iterations (--cost-calibration, else FLOPs). interleaved: module i in
    pipeline-size x K_i chunks, chunk j on stage j mod P (dynamic only). auto: the fastest of
    them by SEMU on the run's first iterations. Default: interleaved for dynamic, else baseline."""

    vision_chunks_per_stage: int | Literal["auto"] = 1
    """K: the vision encoder is cut into pipeline-size x K chunks, chunk j on stage j mod P
    (dynamic). auto: DIP's rule (K_i = floor(T_i / T_1) over the modules' latencies at their
    sub-microbatch sizes), every module's layers then split by measured cost (needs
    --pipeline-schedule dynamic)."""

    audio_chunks_per_stage: int | Literal["auto"] = 1
    """K: the audio encoder is cut into pipeline-size x K chunks (dynamic); auto as for
    --vision-chunks-per-stage."""

    llm_chunks_per_stage: int | Literal["auto"] = 1
    """K: the LLM is cut into pipeline-size x K chunks (dynamic and interleaved); auto as for
    --vision-chunks-per-stage."""

    encoder_sub_microbatch_tokens: int = 0
    """Split each microbatch's images/audio into sub-microbatches of at most this many encoder
    tokens (whole items) that flow through the encoder chunks separately; 0 keeps one sub per
    encoder and microbatch."""

    encoder_sub_microbatch_size: int | Literal["auto"] = 0
    """Split each microbatch's N units of an encoder into ceil(N / B) near-equal
    sub-microbatches (whole items), B units each at most; auto: per encoder, the smallest B
    that keeps 95% of its best measured throughput (DIP's partitioner; needs --pipeline-schedule
    dynamic). 0: not used (see --encoder-sub-microbatch-tokens)."""

    pipeline_recompute: Literal["none", "all"] = "none"
    """Runtime schedules: recompute every chunk's forward in its backward (activation
    checkpointing per stage)."""

    pipeline_receive_posting: Literal["step", "send"] | None = None
    """Runtime schedules: post every receive when the step starts (step: all buffers at once),
    or each just ahead of the send after it (send: the fewest buffers alive). Default: step on
    gloo, where a receive posted after its tensor was sent waits for a core (measured on CPU);
    send on NCCL, where early buffers would hold GPU memory the schedule's limit does not count."""

    schedule_search_budget_ms: float | None = None
    """dynamic: milliseconds the hierarchical schedule search (MCTS over segment priorities,
    each rollout ordered greedily and scored by SEMU) may spend on one batch, one batch ahead;
    a search that has not finished when its step starts leaves that step to the greedy order.
    0 keeps the greedy dual-queue order and searches nothing. Default: 200 where the search has
    a CPU core of its own (a GPU run, or a host with more cores than its ranks' threads) or a
    memory limit needs it, else 0: on a host whose cores all compute, the search would take
    its time from the step."""

    schedule_search_rollouts: int = 48
    """dynamic: rollouts of the schedule search per batch (with the run's seed this fixes the
    schedule, so runs and resumes agree; the time budget may stop the search earlier)."""

    schedule_search_workers: int = 1
    """dynamic: processes that score the schedule search's rollouts on the planner's host (at
    most half its cores); each wave of the search expands this many nodes, so with the seed
    and the rollouts this fixes the schedule whatever the processes' timing (another count is
    another search). 1: the search runs in the trainer's process alone."""

    schedule_search_guard_interval: int = 256
    """dynamic, searched: iterations from one measured probe of the search's gain to the next.
    A probe (24 iterations, from iteration 8) runs the search in alternate blocks of 4 and
    compares the measured step times, each over SEMU's greedy time of its batch; the search
    stays on until the next probe only where it measured at least 1% faster than greedy. 0: no
    probe, the search runs on every batch (the schedules of every run are then the same)."""

    schedule_search_alternate: int = 0
    """dynamic, searched, for side-by-side measurement: alternate blocks of this many
    iterations between the searched schedule and greedy's (nothing searched) for the whole run,
    in place of the guard (tools/bench/pipeline_cpu.py runs two runs of opposite phase, so that
    every batch runs once each way). 0: off."""

    schedule_search_alternate_first: Literal["searched", "greedy"] = "searched"
    """With --schedule-search-alternate, which order runs the first block."""

    pipeline_memory_limit_gb: float | None = None
    """dynamic: the memory one device may use (GiB, parameters, gradients and optimizer states
    included); the schedule search keeps every batch's activations within what is left, and
    chooses what to recompute. Default: the GPU's memory; none on a CPU."""

    def chunks_per_stage(self) -> dict[str, int | str]:
        """K per module (an int, or ``auto``)."""
        return {m: getattr(self, f"{m}_chunks_per_stage") for m in PHASES}

    @property
    def auto_flags(self) -> list[str]:
        """The flags set to ``auto`` (the partitioner chooses their values)."""
        flags = [f"--{m}-chunks-per-stage" for m in PHASES
                 if getattr(self, f"{m}_chunks_per_stage") == AUTO]  # fmt: skip
        if self.encoder_sub_microbatch_size == AUTO:
            flags.append("--encoder-sub-microbatch-size")
        return flags

    @property
    def layout(self) -> str:
        """``--pipeline-layout``, or the schedule's default when not given."""
        default = "interleaved" if self.pipeline_schedule == "dynamic" else "baseline"
        return self.pipeline_layout or default

    @property
    def uses_runtime(self) -> bool:
        """Whether the schedule is one of OrchWeave's runtime (it runs only with PP > 1)."""
        return self.pipeline_schedule != "megatron"


@dataclass(kw_only=True)
class LoggingConfig:
    """OrchWeave: logs and metrics."""

    log_level: Literal["debug", "info", "warning", "error"] | None = None
    """Level of the run's log. Default: Megatron's --logging-level, else info. At info the log
    is the setup summary and the iteration lines; debug adds megatron-core's parameter listings
    and repeated warnings."""

    metrics_jsonl: str | None = None
    """Append one JSON object of metrics per iteration to this file (last rank only)."""

    step_prediction: bool = False
    """Predict every iteration beside its measurement (needs --timing-log-level 1 or 2): SEMU's
    step of the last rank's pipeline replica (same microbatches and schedule, the
    --cost-calibration), or the balance plan's per-phase loads. Costs the last rank a few
    milliseconds per iteration."""

    profile_trace: str | None = None
    """With --profile: write the profiled iterations as one Chrome/Perfetto trace here, a track
    per rank (every timer at level 2, torch.profiler's events with --use-pytorch-profiler) and
    a track per predicted rank (SEMU's, or the balance plan's, prediction of the same
    iterations)."""

    profile_png: str | None = None
    """With --profile: draw the last profiled iteration here, measured above predicted on one
    time axis (needs matplotlib: the 'plots' extra)."""


OPTION_GROUPS: tuple[tuple[str, type], ...] = (
    ("OrchWeave: workload", WorkloadConfig),
    ("OrchWeave: encoder inputs and projectors", MultimodalConfig),
    ("OrchWeave: batch post-balancing (OrchMLLM)", PostBalanceConfig),
    ("OrchWeave: pipeline runtime (PipeWeaver/DIP)", PipelineConfig),
    ("OrchWeave: logging", LoggingConfig),
)
"""OrchWeave's flag groups besides the encoders' (those are :class:`EncoderArgs` per encoder)."""


def data_source(args: Any) -> "DataSourceConfig | None":
    """The real-data flags of parsed arguments, or None without ``--data-path``."""
    paths = getattr(args, "data_path", None)
    if not paths:
        return None
    paths = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    return DataSourceConfig(
        paths[0],
        args.num_workers,
        args.tokenizer_type,
        args.tokenizer_model,
        data_blend=tuple(paths) if len(paths) > 1 else (),
        prompt_format=getattr(args, "prompt_format", "caption"),
    )


def config_from_args(cls: type, args: Any, prefix: str = "", **overrides: Any):
    """Instantiate config dataclass ``cls`` from parsed arguments carrying its field names.

    Args:
        cls: a dataclass whose fields are (``prefix_`` +) argument names.
        args: the parsed namespace.
        prefix: for per-encoder groups, the encoder's name.
        **overrides: fields set otherwise than from an argument of the same name.
    """
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    key = (lambda n: f"{prefix}_{n}") if prefix else (lambda n: n)
    kwargs = {n: getattr(args, key(n)) for n in names if hasattr(args, key(n))}
    return cls(**{**kwargs, **overrides})


@dataclass(frozen=True)
class DataSourceConfig:
    """Real data: Megatron's own flags (--data-path, --num-workers, --tokenizer-*), not a group
    of ours."""

    data_path: str
    """The Energon dataset directory or metadataset YAML (the first entry of a blend)."""

    num_workers: int
    """Processes that decode the payloads' media (0: the main process)."""

    tokenizer_type: str | None
    """``--tokenizer-type``."""

    tokenizer_model: str | None
    """``--tokenizer-model``: the tokenizer's local directory."""

    data_blend: tuple[str, ...] = ()
    """Every ``--data-path`` entry when there are several (``W1 DIR1 W2 DIR2 ...`` or
    directories of equal weight); empty for one directory or metadataset YAML."""

    prompt_format: str = "caption"
    """``--prompt-format``."""


@dataclass(frozen=True)
class ParallelConfig:
    """The parallel layout of a run."""

    world_size: int
    """Processes."""

    tensor: int
    """Tensor-parallel size."""

    pipeline: int
    """Pipeline-parallel size."""

    @property
    def data(self) -> int:
        """Data-parallel size."""
        return self.world_size // (self.tensor * self.pipeline)


@dataclass
class RunConfig:
    """Everything a run is configured with, typed: Megatron's configs and OrchWeave's."""

    parallel: ParallelConfig
    """TP, PP, DP and the world size."""

    training: Any
    """``megatron.training.config.TrainingConfig``: batch sizes, iterations, exit interval."""

    scheduler: Any
    """``megatron.training.config.SchedulerConfig``: learning-rate and weight-decay schedules."""

    checkpoint: Any
    """``megatron.training.config.CheckpointConfig``: --save, --load and their intervals."""

    logger: Any
    """``megatron.training.config.LoggerConfig``: --log-interval, --logging-level, ..."""

    optimizer: Any
    """``megatron.core.optimizer.OptimizerConfig``."""

    ddp: Any
    """``megatron.core.distributed.DistributedDataParallelConfig``."""

    distributed: Any
    """``megatron.training.config.DistributedInitConfig``: backend and timeout."""

    seq_length: int
    """LLM sequence length (``--seq-length``)."""

    vocab_size: int
    """``--vocab-size``, unpadded: synthetic token ids are drawn below it."""

    seed: int
    """``--seed``: initialisation and, by default, the workload."""

    workload: WorkloadConfig
    """The data."""

    encoders: Mapping[str, EncoderArgs]
    """Per encoder present (``--<name>-num-layers`` > 0), its sizes with defaults resolved."""

    multimodal: MultimodalConfig
    """Encoder inputs and projectors."""

    balance: PostBalanceConfig
    """Batch post-balancing."""

    pipeline: PipelineConfig
    """The pipeline runtime."""

    logging: LoggingConfig
    """Logs and metrics."""

    data: DataSourceConfig | None = None
    """Real data (``--data-path``), or None for the synthetic workload."""

    profiling: Any = None
    """``megatron.training.config.ProfilingConfig``: --profile, --profile-step-start/-end, ..."""

    args: Any = field(repr=False, default=None)
    """The parsed namespace, for megatron-core helpers that take Megatron's ``args``."""

    @property
    def micro_batch_size(self) -> int:  # samples per microbatch per DP rank (Megatron's order)
        return self.training.micro_batch_size

    @property
    def global_batch_size(self) -> int:  # samples per iteration over all DP ranks
        return self.training.global_batch_size

    @property
    def num_microbatches(self) -> int:  # per DP rank per iteration, as Megatron loads them
        return self.global_batch_size // (self.micro_batch_size * self.parallel.data)

    @property
    def uses_runtime(self) -> bool:
        """Whether OrchWeave's pipeline runtime runs the step (a runtime schedule, PP > 1)."""
        return self.pipeline.uses_runtime and self.parallel.pipeline > 1

    @property
    def distributed_timeout(self) -> timedelta:
        """How long any wait on another rank may last (``--distributed-timeout-minutes``)."""
        return timedelta(minutes=self.distributed.distributed_timeout_minutes)

    @property
    def packing_limit(self) -> int:
        """Most LLM tokens of one microbatch: ``--micro-batch-size x --seq-length``."""
        return self.micro_batch_size * self.seq_length

    @classmethod
    def from_args(cls, args) -> "RunConfig":
        """Instantiate every config dataclass from arguments parsed and checked by
        :func:`megatron.mllm.arguments.parse_arguments`."""
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig
        from megatron.training.config import (
            CheckpointConfig,
            DistributedInitConfig,
            LoggerConfig,
            ProfilingConfig,
            SchedulerConfig,
            TrainingConfig,
        )

        checkpoint = config_from_args(
            CheckpointConfig, args, load_optim=not args.no_load_optim, load_rng=not args.no_load_rng
        )
        # Megatron's flag names differ from DDP's fields here. The distributed optimizer
        # (--use-distributed-optimizer) shards over DP in DDP and in the optimizer alike;
        # --overlap-grad-reduce buckets the gradients (--ddp-bucket-size, else megatron-core's
        # default) and megatron.mllm.grad_overlap orders their reductions.
        ddp = config_from_args(
            DistributedDataParallelConfig,
            args,
            bucket_size=args.ddp_bucket_size,
            grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
            check_for_nan_in_grad=args.check_for_nan_in_loss_and_grad,
            use_distributed_optimizer=args.use_distributed_optimizer,
        )
        encoders = {}
        for name in ENCODER_NAMES:
            enc = config_from_args(EncoderArgs, args, prefix=name)
            if enc.num_layers > 0:
                encoders[name] = enc
        return cls(
            parallel=ParallelConfig(
                args.world_size, args.tensor_model_parallel_size, args.pipeline_model_parallel_size
            ),
            training=config_from_args(TrainingConfig, args),
            scheduler=config_from_args(SchedulerConfig, args),
            checkpoint=checkpoint,
            logger=config_from_args(LoggerConfig, args),
            optimizer=config_from_args(OptimizerConfig, args),
            ddp=ddp,
            distributed=config_from_args(DistributedInitConfig, args),
            seq_length=args.seq_length,
            vocab_size=args.vocab_size,
            seed=args.seed,
            workload=config_from_args(WorkloadConfig, args),
            encoders=encoders,
            multimodal=config_from_args(MultimodalConfig, args),
            balance=config_from_args(PostBalanceConfig, args),
            pipeline=config_from_args(PipelineConfig, args),
            logging=config_from_args(LoggingConfig, args),
            profiling=config_from_args(ProfilingConfig, args, use_nsys_profiler=args.profile),
            data=data_source(args),
            args=args,
        )
