# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The sizes of a multimodal model that decide what its work costs, and its FLOPs formula.

Pure Python: the trainer builds a :class:`ModelShape` from its flags, and the balancer, the
logger and the step emulator all cost work with the same formula, so a "cost" means the same
thing everywhere. Multiply-adds count as 2 FLOPs; a training step is forward (1x) plus
backward (2x).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from orchestration.workload import SampleMeta

TRAIN_FLOPS_MULTIPLIER = 3
"""Backward costs twice the forward: gradients w.r.t. inputs and w.r.t. weights."""


@dataclass(frozen=True)
class TransformerShape:
    """One stack of transformer layers and what sits at its ends."""

    num_layers: int
    """Transformer layers."""

    hidden_size: int
    """Model width."""

    ffn_hidden_size: int
    """MLP inner width."""

    num_attention_heads: int
    """Query heads."""

    num_query_groups: int | None = None
    """Key/value heads (GQA); None means as many as query heads."""

    gated_mlp: bool = False
    """SwiGLU-style MLP with two input projections."""

    causal: bool = False
    """Causal attention (LLM) halves the useful score FLOPs; encoders attend both ways."""

    input_flops_per_token: float = 0.0
    """Forward FLOPs per token before the first layer (patch/frame embedding)."""

    output_flops_per_token: float = 0.0
    """Forward FLOPs per token after the last layer (LM head; projector per output token)."""

    embedding_params: int = 0
    """Parameters of lookup-table input layers (token and position embeddings): memory and
    optimizer state, but no FLOPs. The input and output layers' matrices are derived from
    ``input_flops_per_token`` and ``output_flops_per_token`` (2 FLOPs per weight per token)."""

    add_bias_linear: bool = True
    """Linear layers have biases (Megatron's default; ``--disable-bias-linear`` clears it)."""

    normalization: str = "LayerNorm"
    """``LayerNorm`` (weight and bias) or ``RMSNorm`` (weight only)."""

    @property
    def kv_channels(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    def layer_linear_flops_per_token(self) -> float:
        """Forward FLOPs of one layer's matrix multiplies, per token."""
        h = self.hidden_size
        groups = self.num_query_groups or self.num_attention_heads
        qkv = 2 * h * (h + 2 * groups * self.kv_channels)
        proj = 2 * h * h
        mlp = 2 * h * self.ffn_hidden_size * (3 if self.gated_mlp else 2)
        return float(qkv + proj + mlp)

    def layer_params(self) -> int:
        """Parameters of one layer: the linear weights, their biases and the two norms."""
        h = self.hidden_size
        groups = self.num_query_groups or self.num_attention_heads
        weights = int(self.layer_linear_flops_per_token()) // 2
        biases = 0
        if self.add_bias_linear:
            fc1 = self.ffn_hidden_size * (2 if self.gated_mlp else 1)
            biases = (h + 2 * groups * self.kv_channels) + h + fc1 + h
        norms = 2 * h * (2 if self.normalization == "LayerNorm" else 1)
        return weights + biases + norms

    def edge_params(self) -> int:
        """Parameters outside the layers: input layer, embeddings, head (or projector)."""
        return (
            int(self.input_flops_per_token) // 2
            + int(self.output_flops_per_token) // 2
            + self.embedding_params
        )

    def layer_attention_flops(self, seq_len: int) -> float:
        """Forward FLOPs of one layer's scores and weighted sum for one sequence."""
        full = 2 * 2 * seq_len * seq_len * self.hidden_size
        return full / 2 if self.causal else float(full)

    def forward_flops(self, seq_lens: Iterable[int], layers: int | None = None) -> float:
        """Forward FLOPs of ``layers`` layers (default all) over independent sequences."""
        layers = self.num_layers if layers is None else layers
        total = 0.0
        for n in seq_lens:
            total += layers * (
                n * self.layer_linear_flops_per_token() + self.layer_attention_flops(n)
            )
        return total


@dataclass(frozen=True)
class ModelShape:
    """The encoders and the LLM of a multimodal model."""

    llm: TransformerShape
    """The language model; its head is in ``output_flops_per_token``."""

    encoders: Mapping[str, TransformerShape] = field(default_factory=dict)
    """Encoders by phase name ("vision", "audio"); the projector is in ``output_flops_per_token``."""

    params_dtype_bytes: int = 2
    """Bytes of one parameter and one activation element: 2 for bf16/fp16, 4 for fp32."""

    def module(self, phase: str) -> TransformerShape:
        """The shape of one module: "llm" or an encoder's phase name."""
        return self.llm if phase == "llm" else self.encoders[phase]

    def module_params(self, phase: str) -> int:
        """Parameters of one module: its layers plus its input layer and head/projector."""
        shape = self.module(phase)
        return shape.num_layers * shape.layer_params() + shape.edge_params()

    def total_params(self) -> int:
        """Parameters of the whole model."""
        return self.module_params("llm") + sum(self.module_params(e) for e in self.encoders)

    def phase_flops(self, phase: str, seq_lens: Iterable[int], output_tokens: int = 0) -> float:
        """Training FLOPs of one phase over independent sequences (units, or LLM samples).

        Args:
            phase: "vision", "audio" or "llm".
            seq_lens: tokens of each independent sequence.
            output_tokens: tokens leaving an encoder phase through its projector; ignored for
                the LLM, whose head runs on every token.
        """
        shape = self.llm if phase == "llm" else self.encoders[phase]
        seq_lens = list(seq_lens)
        tokens = sum(seq_lens)
        fwd = shape.forward_flops(seq_lens) + tokens * shape.input_flops_per_token
        fwd += (tokens if phase == "llm" else output_tokens) * shape.output_flops_per_token
        return TRAIN_FLOPS_MULTIPLIER * fwd

    def sample_phase_flops(self, sample: SampleMeta) -> dict[str, float]:
        """Training FLOPs of each phase for one sample, packed without padding."""
        out = {"llm": self.phase_flops("llm", [sample.llm_tokens])}
        for phase in self.encoders:
            items = sample.encoder_items(phase)
            units = [u for item in items for u in item.units]
            llm_out = sum(item.llm_tokens for item in items)
            out[phase] = self.phase_flops(phase, units, llm_out)
        return out

    def batch_flops(self, samples: Iterable[SampleMeta]) -> float:
        """Model training FLOPs of a batch: real tokens only, per-sample attention."""
        return sum(sum(self.sample_phase_flops(s).values()) for s in samples)
