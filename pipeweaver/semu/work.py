# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the model costs per compute, independent of the hardware.

:class:`ModelCosts` gives, per module and per layer, the forward and backward FLOPs for a given
set of packed sequences, the bytes moved through device memory, the activation bytes kept for
the backward (with and without recompute), and the weight, gradient and optimizer bytes;
:meth:`ModelCosts.compute_work` sums them for one compute (:class:`ComputeWork`). Everything is
per tensor-parallel rank. :mod:`pipeweaver.semu.timing` turns the work into seconds.

Activation memory per layer and token follows Korthikanti et al. ("Reducing activation
recomputation in large transformer models"), with the tensors of megatron-core's layer:
LayerNorm inputs and outputs (replicated over TP unless sequence parallelism splits them), Q/K/V,
the attention output, the MLP's two activations (split over TP), dropout masks when dropout is
on, the attention score matrix only without flash attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from orchestration.model_shape import TransformerShape
from pipeweaver.semu.model import LayerRecompute, ModelSpec

_SELECTIVE = LayerRecompute("selective")


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
        return tokens * per_token + self.core_attention_bytes(module, seq_lens)

    def core_attention_bytes(self, module: str, seq_lens: Sequence[int]) -> float:
        """Bytes the core attention of one layer keeps beyond its Q/K/V inputs and its output:
        what selective recompute (``--recompute-granularity selective``) does not keep."""
        heads = self.module(module).num_attention_heads / self.tp
        if self.flash:
            return sum(seq_lens) * 4 * heads  # softmax log-sum-exp, fp32
        # Megatron's unfused attention keeps the full softmax output (and a dropout mask),
        # causal or not.
        per_score = self.dtype + (1 if self.attention_dropout else 0)
        return heads * per_score * sum(n * n for n in seq_lens)

    def recompute_of(self, memory: str) -> LayerRecompute:
        """Megatron's recompute inside the chunk under a pair's memory strategy (a
        :attr:`pipeweaver.ir.Compute.strategy`): the run's ``--recompute-*`` flags for ``none``
        (and for the strategies that keep only the chunk's input anyway); the pair's own for
        ``selective`` (core attention) and ``layers<n>`` (block method, n layers), which the
        runtime sets on the chunk for that pair's forward and backward only."""
        if memory == "selective":
            return _SELECTIVE
        if memory.startswith("layers"):
            flags = self.spec.training.recompute
            return LayerRecompute(
                "full", "block", int(memory[6:]), flags.distribute_saved_activations
            )
        return self.spec.training.recompute

    def layer_input_bytes(
        self, module: str, tokens: int, recompute: LayerRecompute | None = None
    ) -> float:
        """Bytes of one layer's input, as a full-recompute checkpoint keeps it (under the run's
        recompute flags, or ``recompute``)."""
        nbytes = self.boundary_bytes(module, tokens)
        recompute = recompute or self.spec.training.recompute
        if recompute.distribute_saved_activations and not self.sp:
            nbytes /= self.tp  # split over the TP group while it waits for the backward
        return nbytes

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
            memory: the pair's strategy (:attr:`pipeweaver.ir.Compute.strategy`): "none",
                "recompute", "offload", "selective" or "layers<n>".
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
        e_flops = e_bytes = in_kept = head_kept = 0.0
        if first:
            e_flops, e_bytes, in_kept = self.input_work(module, tokens)
        if last:
            f, b, head_kept = self.head_work(module, tokens, out_rows)
            e_flops, e_bytes = e_flops + f, e_bytes + b
        e_kept = in_kept + head_kept
        full_kept = n_layers * act + e_kept
        input_kept = self.boundary_bytes(module, tokens)
        coll_bytes = tokens * s.hidden_size * self.dtype
        coll = 2 * n_layers if self.tp > 1 else 0
        # Passes over the layers, over their core attention and over the edges: a backward is
        # two forwards' work, plus the forwards it reruns.
        layer_mult = attention_mult = edge_mult = 1.0 if kind == "F" else 2.0
        coll_n, passes = coll, n_layers
        recompute = self.recompute_of(memory)
        if memory == "recompute":
            kept = input_kept
            transient = full_kept if kind == "B" else 0.0
            if kind == "B":  # the runtime reruns the chunk's whole forward, edges included
                layer_mult = attention_mult = edge_mult = 3.0
                coll_n, passes = 2 * coll, 2 * n_layers
        elif memory == "offload":
            kept, transient = input_kept, full_kept
        elif recompute.granularity == "none":
            kept, transient = full_kept, 0.0
        else:
            kept, transient, rerun, attention_rerun = self.layer_recompute(
                module, n_layers, seq_lens, act, in_kept, head_kept, recompute
            )
            if kind == "B":
                share = rerun / n_layers if n_layers else 0.0
                layer_mult += share
                attention_mult += share + attention_rerun
                coll_n += 2 * rerun if self.tp > 1 else 0
                passes += rerun
            else:
                transient = 0.0  # the forward keeps only what the backward will rebuild from
        return ComputeWork(
            linear_flops=layer_mult * n_layers * lin,
            attention_flops=attention_mult * n_layers * att,
            edge_flops=edge_mult * e_flops,
            linear_bytes=layer_mult * n_layers * lb,
            attention_bytes=attention_mult * n_layers * ab,
            edge_bytes=edge_mult * e_bytes,
            kept_bytes=kept,
            transient_bytes=transient,
            tp_collectives=coll_n,
            tp_collective_bytes=coll_bytes,
            layer_passes=passes,
            offload_bytes=full_kept if memory == "offload" else 0.0,
        )

    def layer_recompute(
        self, module: str, n_layers: int, seq_lens: Sequence[int], layer_bytes: float,
        input_kept: float, head_kept: float, recompute: LayerRecompute | None = None
    ) -> tuple[float, float, int, float]:  # fmt: skip
        """A chunk's memory and reruns under Megatron's recompute (:class:`LayerRecompute`).

        Args:
            module: the chunk's module.
            n_layers: its layers.
            seq_lens: the sequences of the compute.
            layer_bytes: what one layer keeps without recompute (measured or modelled).
            input_kept, head_kept: what its input layer and its head keep (never recomputed:
                they are outside the transformer block; the head's are freed first in the
                backward, the input layer's last).
            recompute: the recompute (default: the run's flags; a pair's own:
                :meth:`recompute_of`).

        Returns:
            ``(kept, transient, rerun_layers, attention_reruns)``: bytes kept from the forward
            to the backward, bytes the backward needs beyond them at its peak, layers whose
            forward the backward reruns, and reruns of every layer's core attention (selective:
            1).
        """
        recompute = recompute or self.spec.training.recompute
        edges = input_kept + head_kept
        if recompute.granularity == "selective":
            saved = self.core_attention_bytes(module, seq_lens)
            return n_layers * (layer_bytes - saved) + edges, 0.0, 0, 1.0
        stored, whole, rerun = recompute.plan(n_layers)
        one_input = self.layer_input_bytes(module, sum(seq_lens), recompute)
        kept = stored * one_input + whole * layer_bytes + edges
        peak = input_kept + recompute.backward_peak(n_layers, one_input, layer_bytes)
        return kept, max(0.0, peak - kept), rerun, 0.0

    # ---------------------------------------------------------------- static memory

    def static_bytes(
        self, params: float, data_parallel: int, gathered_params: float = 0.0
    ) -> dict[str, float]:
        """Weights, gradients and optimizer states of ``params`` local parameters.

        Megatron's bytes per parameter (docs/architecture.md [4]): weights in the model's dtype,
        fp32 main gradients, Adam's two fp32 moments plus an fp32 master copy when the weights
        are 16-bit: 18 bytes for bf16 (16 for fp32), 6 + 12/d with the distributed optimizer
        (8 + 8/d). Megatron-FSDP shards the optimizer states (``optim``), then the gradients
        (``optim_grads``), then the weights too (``optim_grads_params``: 18/d, plus the layer
        it gathers for the compute and the one it prefetches, ``gathered``).

        Args:
            params: parameters of the rank's chunks (one TP rank's).
            data_parallel: DP size d.
            gathered_params: the rank's largest layer (FSDP's unit of all-gather).
        """
        parallel = self.spec.parallel
        shard = {
            k: data_parallel if parallel.sharded(k) else 1 for k in ("optim", "grads", "params")
        }
        out = {
            "weights": params * self.dtype / shard["params"],
            "gradients": params * self.spec.training.grad_dtype_bytes / shard["grads"],
            "optimizer": params * (8.0 + (4.0 if self.dtype < 4 else 0.0)) / shard["optim"],
        }
        if shard["params"] > 1:
            out["gathered"] = 2 * gathered_params * self.dtype
        return out

    def optimizer_bytes_moved(self, params: float, data_parallel: int) -> float:
        """Device-memory bytes one Adam step touches for ``params`` local parameters."""
        per = self.spec.training.grad_dtype_bytes + 24.0 + (6.0 if self.dtype < 4 else 0.0)
        if self.spec.parallel.sharded("optim"):
            per /= data_parallel
        return params * per
