# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The model SEMU costs, built from the trainer's own flags, and its cost description.

:func:`model_from_flags` reads the same flags as ``scripts/pretrain_mllm.py`` (Megatron's plus
OrchWeave's, with the same defaults) and derives the :class:`~orchestration.model_shape.ModelShape`
exactly as ``megatron.mllm.config.MLLMConfig.shape()`` does (tested against it), plus what a
simulator needs beyond FLOPs: dtype, parallel layout, batch sizes, recompute, vocabulary.

:class:`ModelCosts` is the hardware-independent cost description: per module and per layer, the
forward and backward FLOPs for a given set of packed sequences, the bytes moved through device
memory, the activation bytes kept for the backward (with and without recompute), and the weight,
gradient and optimizer bytes. Everything is per tensor-parallel rank.

Activation memory per layer and token follows Korthikanti et al. ("Reducing activation
recomputation in large transformer models"), with the tensors of megatron-core's layer:
LayerNorm inputs and outputs (replicated over TP unless sequence parallelism splits them), Q/K/V,
the attention output, the MLP's two activations (split over TP), dropout masks when dropout is
on, the attention score matrix only without flash attention.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

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


# --------------------------------------------------------------------------------------------
# The cost description


@dataclass(frozen=True)
class ComputeWork:
    """What one compute (F or B of a chunk on some sequences) does, per tensor-parallel rank."""

    linear_flops: float
    """Matrix-multiply FLOPs of the layers (recompute included)."""

    attention_flops: float
    """Attention score and weighted-sum FLOPs (recompute included)."""

    edge_flops: float
    """FLOPs of the input layer, head or projector, when the chunk holds them."""

    linear_bytes: float
    """Device-memory bytes moved by the layers' linear and elementwise work."""

    attention_bytes: float
    """Device-memory bytes moved by attention."""

    edge_bytes: float
    """Device-memory bytes moved by the input layer, head or projector."""

    kept_bytes: float
    """Activation bytes kept from the F until the B (depends on the memory strategy)."""

    transient_bytes: float
    """Extra activation bytes alive during this compute only (recomputed activations)."""

    tp_collectives: int
    """Tensor-parallel all-reduces (or reduce-scatter/all-gather pairs) on the critical path."""

    tp_collective_bytes: float
    """Bytes of each of them."""

    layer_passes: int
    """Transformer layer passes (for fixed per-layer overheads)."""

    offload_bytes: float = 0.0
    """Bytes moved to or from host memory (offload strategy)."""


class ModelCosts:
    """Per-module, per-layer FLOPs, bytes and memory of a :class:`ModelSpec`, per TP rank.

    Args:
        spec: the model and run.
        flash_attention: attention keeps no score matrix (GPUs with TE/flash kernels; the CPU's
            SDPA kernel too).
    """

    def __init__(self, spec: ModelSpec, flash_attention: bool = True):
        self.spec = spec
        self.shape = spec.shape
        self.tp = spec.parallel.tensor
        self.sp = spec.parallel.sequence_parallel
        self.dtype = spec.shape.params_dtype_bytes
        self.flash = flash_attention
        self.hidden_dropout = spec.training.hidden_dropout > 0
        self.attention_dropout = spec.training.attention_dropout > 0

    # ---------------------------------------------------------------- per layer

    def module(self, module: str) -> TransformerShape:
        """Shape of a module."""
        return self.shape.module(module)

    def layer_flops(self, module: str, seq_lens: Sequence[int]) -> tuple[float, float]:
        """Forward ``(linear, attention)`` FLOPs of one layer over packed sequences."""
        s = self.module(module)
        tokens = sum(seq_lens)
        linear = tokens * s.layer_linear_flops_per_token() / self.tp
        attention = sum(s.layer_attention_flops(n) for n in seq_lens) / self.tp
        return linear, attention

    def _act_elems_per_token(self, s: TransformerShape) -> tuple[float, float]:
        """(replicated-over-TP, split-over-TP) activation elements kept per token per layer."""
        kv = 2 * (s.num_query_groups or s.num_attention_heads) * s.kv_channels
        ffn_in = s.ffn_hidden_size * (2 if s.gated_mlp else 1)
        # LayerNorm inputs and outputs of both blocks: replicated unless sequence parallel.
        replicated = 4 * s.hidden_size
        # Q, K, V; attention output; fc1 output; activation output.
        split = s.hidden_size + kv + s.hidden_size + ffn_in + s.ffn_hidden_size
        return replicated, split

    def layer_activation_bytes(self, module: str, seq_lens: Sequence[int]) -> float:
        """Bytes one layer keeps for its backward over packed sequences (no recompute)."""
        s = self.module(module)
        tokens = sum(seq_lens)
        rep, split = self._act_elems_per_token(s)
        rep_div = self.tp if self.sp else 1
        per_token = self.dtype * (rep / rep_div + split / self.tp)
        if self.hidden_dropout:
            per_token += 2 * s.hidden_size / rep_div  # two 1-byte masks
        heads = s.num_attention_heads / self.tp
        if self.flash:
            per_token += 4 * heads  # softmax log-sum-exp, fp32
            quadratic = 0.0
        else:
            # Megatron's unfused attention keeps the full softmax output (and a dropout mask),
            # causal or not.
            per_score = self.dtype + (1 if self.attention_dropout else 0)
            quadratic = heads * per_score * sum(n * n for n in seq_lens)
        return tokens * per_token + quadratic

    def layer_bytes(self, module: str, seq_lens: Sequence[int]) -> tuple[float, float]:
        """Forward device-memory ``(linear, attention)`` bytes of one layer."""
        s = self.module(module)
        tokens = sum(seq_lens)
        rep, split = self._act_elems_per_token(s)
        rep_div = self.tp if self.sp else 1
        weights = s.layer_params() * self.dtype / self.tp
        # Every kept tensor is written once and read once by the next op.
        linear = weights + 2 * tokens * self.dtype * (rep / rep_div + split / self.tp)
        kv = 2 * (s.num_query_groups or s.num_attention_heads) * s.kv_channels
        attention = tokens * self.dtype * (2 * s.hidden_size + kv) / self.tp
        if not self.flash:
            attention += (
                3 * self.dtype * s.num_attention_heads / self.tp * sum(n * n for n in seq_lens)
            )
        return linear, attention

    def layer_params(self, module: str) -> float:
        """Parameters of one layer on one TP rank."""
        return self.module(module).layer_params() / self.tp

    # ---------------------------------------------------------------- edges

    def input_work(self, module: str, tokens: int) -> tuple[float, float, float]:
        """Forward ``(flops, bytes, kept bytes)`` of a module's input layer."""
        s = self.module(module)
        d = self.dtype
        if module == "llm":
            # Embedding lookup: no FLOPs; the token and position rows are read, the sum written.
            return (
                0.0,
                3.0 * tokens * s.hidden_size * d,
                (tokens * s.hidden_size if self.hidden_dropout else 0.0),
            )
        in_dim = s.input_flops_per_token / (2 * s.hidden_size)
        flops = tokens * s.input_flops_per_token / self.tp
        nbytes = tokens * (in_dim + s.hidden_size) * d + s.input_flops_per_token / 2 * d / self.tp
        return flops, nbytes, tokens * in_dim * d

    def head_work(self, module: str, tokens: int, out_rows: int) -> tuple[float, float, float]:
        """Forward ``(flops, bytes, kept bytes)`` of a module's head (final norm and LM head
        with the loss, or pooling and projector)."""
        s = self.module(module)
        d = self.dtype
        rep_div = self.tp if self.sp else 1
        if module == "llm":
            vocab = s.output_flops_per_token / (2 * s.hidden_size) / self.tp
            flops = tokens * s.output_flops_per_token / self.tp
            weights = s.output_flops_per_token / 2 * d / self.tp
            # Logits written in dtype, copied to fp32, softmax in fp32.
            nbytes = weights + tokens * (2 * s.hidden_size * d + vocab * (2 * d + 8))
            kept = tokens * (2 * s.hidden_size * d / rep_div + 4 * vocab)
            return flops, nbytes, kept
        llm_h = self.shape.llm.hidden_size
        ffn = self.spec.projector_ffn
        flops = out_rows * s.output_flops_per_token / self.tp
        weights = s.output_flops_per_token / 2 * d / self.tp
        nbytes = (
            weights
            + tokens * 2 * s.hidden_size * d
            + out_rows * (s.hidden_size + 2 * ffn / self.tp + llm_h) * d
        )
        kept = (
            tokens * s.hidden_size * d / rep_div
            + out_rows * (s.hidden_size + 2 * ffn / self.tp) * d
        )
        return flops, nbytes, kept

    # ---------------------------------------------------------------- chunks and computes

    def chunk_params(self, module: str, start: int, stop: int) -> float:
        """Parameters of a chunk on one TP rank (layers plus the edges it holds)."""
        s = self.module(module)
        params = (stop - start) * s.layer_params()
        if start == 0:
            params += s.input_flops_per_token / 2 + s.embedding_params
        if stop == s.num_layers:
            params += s.output_flops_per_token / 2
        return params / self.tp

    def boundary_bytes(self, module: str, tokens: int) -> float:
        """Bytes of the activation between two chunks of a module (or its gradient)."""
        rep_div = self.tp if self.sp else 1
        return tokens * self.module(module).hidden_size * self.dtype / rep_div

    def encoder_output_bytes(self, rows: int) -> float:
        """Bytes of an encoder's projected output rows (or their gradient), LLM width."""
        rep_div = self.tp if self.sp else 1
        return rows * self.shape.llm.hidden_size * self.dtype / rep_div

    def compute_work(
        self,
        module: str,
        start: int,
        stop: int,
        kind: str,
        memory: str,
        seq_lens: Sequence[int],
        out_rows: int = 0,
    ) -> ComputeWork:
        """The work of the F or B of chunk ``[start, stop)`` of ``module`` on packed sequences.

        Args:
            module: "vision", "audio" or "llm".
            start, stop: layer range.
            kind: "F" or "B".
            memory: "none", "recompute" or "offload".
            seq_lens: the independent sequences (encoder units, or LLM samples and padding).
            out_rows: LLM rows an encoder's projector produces (encoders' last chunk).
        """
        s = self.module(module)
        n_layers = stop - start
        first, last = start == 0, stop == s.num_layers
        tokens = sum(seq_lens)
        lin, att = self.layer_flops(module, seq_lens)
        lb, ab = self.layer_bytes(module, seq_lens)
        act = self.layer_activation_bytes(module, seq_lens)
        e_flops = e_bytes = e_kept = 0.0
        if first:
            f, b, k = self.input_work(module, tokens)
            e_flops, e_bytes, e_kept = e_flops + f, e_bytes + b, e_kept + k
        if last:
            f, b, k = self.head_work(module, tokens, out_rows)
            e_flops, e_bytes, e_kept = e_flops + f, e_bytes + b, e_kept + k
        full_kept = n_layers * act + e_kept
        input_kept = self.boundary_bytes(module, tokens)
        coll_bytes = tokens * s.hidden_size * self.dtype
        coll = 2 * n_layers if self.tp > 1 else 0
        if kind == "F":
            mult, coll_n, passes = 1.0, coll, n_layers
        else:
            mult, coll_n, passes = 2.0, coll, n_layers
            if memory == "recompute":
                mult, coll_n, passes = 3.0, 2 * coll, 2 * n_layers
        if memory == "recompute":
            kept = input_kept
            transient = full_kept if kind == "B" else 0.0
        elif memory == "offload":
            kept, transient = input_kept, full_kept
        else:
            kept, transient = full_kept, 0.0
        return ComputeWork(
            linear_flops=mult * n_layers * lin,
            attention_flops=mult * n_layers * att,
            edge_flops=mult * e_flops,
            linear_bytes=mult * n_layers * lb,
            attention_bytes=mult * n_layers * ab,
            edge_bytes=mult * e_bytes,
            kept_bytes=kept,
            transient_bytes=transient,
            tp_collectives=coll_n,
            tp_collective_bytes=coll_bytes,
            layer_passes=passes,
            offload_bytes=full_kept if memory == "offload" else 0.0,
        )

    # ---------------------------------------------------------------- static memory

    def static_bytes(self, params: float, data_parallel: int) -> dict[str, float]:
        """Weights, gradients and optimizer states of ``params`` local parameters.

        Adam keeps two fp32 moments, plus an fp32 master copy when parameters are 16-bit;
        the distributed optimizer shards them over DP.
        """
        opt_per_param = 8.0 + (4.0 if self.dtype < 4 else 0.0)
        if self.spec.parallel.distributed_optimizer:
            opt_per_param /= data_parallel
        return {
            "weights": params * self.dtype,
            "gradients": params * self.spec.training.grad_dtype_bytes,
            "optimizer": params * opt_per_param,
        }

    def optimizer_bytes_moved(self, params: float, data_parallel: int) -> float:
        """Device-memory bytes one Adam step touches for ``params`` local parameters."""
        per = self.spec.training.grad_dtype_bytes + 24.0 + (6.0 if self.dtype < 4 else 0.0)
        if self.spec.parallel.distributed_optimizer:
            per /= data_parallel
        return params * per


def replace_shape(spec: ModelSpec, **changes: Any) -> ModelSpec:
    """A copy of ``spec`` with ModelShape fields replaced (tests, what-if studies)."""
    return dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, **changes))
