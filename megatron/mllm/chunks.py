# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Module chunks: a contiguous range of one module's layers, buildable on any rank.

Every module of the multimodal model (vision encoder, audio encoder, LLM) is built as chunks so
that a pipeline can place them freely. The chunk that holds a module's first layer also holds
its input layer (patch or frame embedding, token embedding); the chunk that holds its last layer
also holds its head (final norm plus pooling and projector for an encoder; final norm, output
layer and loss for the LLM). A whole module is simply the chunk ``[0, num_layers)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from megatron.core import tensor_parallel
from megatron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_block import TransformerBlock
from megatron.mllm.batch import EncoderInput, LanguageInput
from megatron.mllm.config import MLLMConfig
from megatron.mllm.init import init_module
from megatron.mllm.specs import projector_submodules, transformer_layer_spec

_LAYER = re.compile(r"^block\.layers\.(\d+)\.")


def global_name(module: str, start: int, local: str) -> str:
    """Layout-independent name of an entry of a chunk's state that starts at layer ``start`` of
    ``module``: its layers renumbered within the module (``llm.layers.5.mlp.linear_fc1.weight``),
    the rest under the module's name."""
    match = _LAYER.match(local)
    if match:
        return f"{module}.layers.{int(match.group(1)) + start}.{local[match.end():]}"
    return f"{module}.{local.removeprefix('block.')}"


@dataclass(frozen=True)
class ChunkId:
    """Which layers of which module a chunk holds."""

    module: str
    """"vision", "audio" or "llm"."""

    start: int
    """First layer (global index within the module)."""

    stop: int
    """One past the last layer."""

    def __str__(self) -> str:
        return f"{self.module}[{self.start}:{self.stop}]"


class ModuleChunk(MegatronModule):
    """Base of the chunks: layer bookkeeping, global parameter names, initialisation."""

    input_layer: str | None = None
    """The attribute of the module's input layer on its first chunk (the forward runs it
    before the layers, though it is registered after them), if the module has one."""

    def __init__(self, mllm: MLLMConfig, chunk: ChunkId, pg_collection):
        total = mllm.num_layers(chunk.module)
        if not 0 <= chunk.start < chunk.stop <= total:
            raise ValueError(f"chunk {chunk} is outside the {total} layers of {chunk.module}")
        config = mllm.chunk_config(chunk.module, chunk.stop - chunk.start)
        super().__init__(config=config)
        self.mllm = mllm
        self.chunk_id = chunk
        self.is_first = chunk.start == 0
        self.is_last = chunk.stop == total
        self.pg_collection = pg_collection
        self.block = TransformerBlock(
            config=config,
            spec=transformer_layer_spec(
                mllm.use_te, causal=chunk.module == "llm", normalization=config.normalization
            ),
            # The chunk always hands its input to the block explicitly; pipeline input tensors
            # are the stage model's business, not the block's.
            pre_process=True,
            post_process=self.is_last,
            pg_collection=pg_collection,
        )

    def forward_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters in the order the forward first uses them: the input layer, the
        layers, the head (the backward produces their gradients in reverse)."""
        first = getattr(self, self.input_layer, None) if self.input_layer else None
        leading = list(first.parameters()) if first is not None else []
        seen = {id(p) for p in leading}
        return leading + [p for p in self.parameters() if id(p) not in seen]

    def global_name(self, local: str) -> str:
        """Layout-independent name of a parameter, e.g. ``llm.layers.5.mlp.linear_fc1.weight``."""
        return global_name(self.chunk_id.module, self.chunk_id.start, local)

    def initialize(self) -> None:
        """Give every parameter its layout-independent initial value."""
        tp = self.pg_collection.tp
        init_module(
            self,
            {n: self.global_name(n) for n, _ in self.named_parameters()},
            self.config,
            self.mllm.init_seed,
            self.mllm.num_layers(self.chunk_id.module),
            tp.rank(),
            tp.size(),
        )

    def run_layers(self, hidden: Tensor, packed_seq_params) -> Tensor:
        """This chunk's transformer layers (and the final norm on the last chunk)."""
        return self.block(hidden, attention_mask=None, packed_seq_params=packed_seq_params)


def sinusoidal_positions(positions: Tensor, dim: int, dtype: torch.dtype) -> Tensor:
    """Fixed sine/cosine embedding of positions within each encoder unit, ``[T, dim]``."""
    half = dim // 2
    freq = torch.exp(
        -math.log(10000.0) * torch.arange(half, device=positions.device, dtype=torch.float32) / half
    )
    angles = positions.to(torch.float32)[:, None] * freq[None, :]
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if dim % 2:
        emb = torch.nn.functional.pad(emb, (0, 1))
    return emb.to(dtype)


class EncoderChunk(ModuleChunk):
    """Layers of an encoder; the first chunk embeds features, the last pools and projects.

    Input: features ``[T, input_dim]`` (first chunk) or hidden states ``[T, 1, h]``.
    Output: hidden states ``[T, 1, h]``, or on the last chunk the item embeddings for the LLM
    ``[R, h_llm]``, one row per LLM position the encoder's items occupy.
    """

    input_layer = "input_embedding"

    def __init__(self, mllm: MLLMConfig, chunk: ChunkId, pg_collection):
        super().__init__(mllm, chunk, pg_collection)
        enc = mllm.encoders[chunk.module]
        dtype = self.config.params_dtype
        if self.is_first:
            self.input_embedding = torch.nn.Linear(enc.input_dim, enc.hidden_size, dtype=dtype)
        if self.is_last:
            self.projector = MultimodalProjector(
                mllm.projector_config(chunk.module),
                projector_submodules(mllm.use_te),
                mllm.projector_type,
                input_size=enc.hidden_size,
                tp_group=pg_collection.tp,
            )
        self.initialize()

    def forward(self, hidden: Optional[Tensor], batch: EncoderInput) -> Tensor:
        """Run this chunk on one microbatch's units of this encoder."""
        hidden = self.body(hidden, batch.features, batch.positions, batch.packed_seq_params())
        if not self.is_last:
            return hidden
        return self.head(hidden.squeeze(1), batch)

    def body(
        self,
        hidden: Optional[Tensor],
        features: Optional[Tensor],
        positions: Tensor,
        packed_seq_params,
    ) -> Tensor:
        """Input embedding (first chunk) and layers: hidden states ``[T, 1, h]`` of the units.

        Units are independent, so the body of any set of units can run on any rank; only the
        head needs a whole item.
        """
        if self.is_first:
            feats = features.to(self.config.params_dtype)
            hidden = self.input_embedding(feats) + sinusoidal_positions(
                positions, self.config.hidden_size, feats.dtype
            )
            hidden = hidden.unsqueeze(1)
        return self.run_layers(hidden, packed_seq_params)

    def head(self, hidden: Tensor, batch: EncoderInput) -> Tensor:
        """Pool each item's encoder tokens into its LLM tokens and project: ``[R, h_llm]``.

        Args:
            hidden: the final hidden states ``[T, h]`` of the microbatch's units, in its order.
            batch: the microbatch's pooling indices.
        """
        # Mean over the encoder tokens that merge into each LLM token (see pooling_pairs).
        pooled = hidden.new_zeros(batch.num_rows, hidden.shape[-1]).index_add(
            0, batch.pool_rows, hidden.index_select(0, batch.pool_tokens)
        ) / batch.pool_counts.to(hidden.dtype)
        return self.projector(pooled.unsqueeze(1)).squeeze(1)


class LanguageChunk(ModuleChunk):
    """Layers of the LLM; the first chunk embeds tokens and splices in encoder outputs, the last
    computes the per-token loss.

    Input: nothing (first chunk; token ids come from the batch) or hidden states ``[S, 1, h]``.
    Output: hidden states ``[S, 1, h]``, or on the last chunk the per-token loss ``[S]``.
    """

    input_layer = "embedding"

    def __init__(self, mllm: MLLMConfig, chunk: ChunkId, pg_collection):
        super().__init__(mllm, chunk, pg_collection)
        config = self.config
        if self.is_first:
            self.embedding = LanguageModelEmbedding(
                config,
                vocab_size=mllm.vocab_size,
                max_sequence_length=mllm.max_sequence_length,
                position_embedding_type="learned_absolute",
                tp_group=pg_collection.tp,
            )
        if self.is_last:
            self.output_layer = tensor_parallel.ColumnParallelLinear(
                config.hidden_size,
                mllm.vocab_size,
                config=config,
                init_method=config.init_method,
                bias=False,
                skip_bias_add=False,
                gather_output=False,
                tp_group=pg_collection.tp,
            )
        self.initialize()

    def forward(
        self,
        hidden: Optional[Tensor],
        batch: LanguageInput,
        encoder_outputs: Optional[dict[str, Tensor]] = None,
    ) -> Tensor:
        """Run this chunk on one microbatch.

        Args:
            hidden: the previous chunk's output; ignored by the first chunk.
            batch: the microbatch's LLM inputs.
            encoder_outputs: first chunk only: each encoder's item embeddings ``[R, h]``.
        """
        if self.is_first:
            hidden = self.embedding(
                input_ids=batch.tokens.unsqueeze(0), position_ids=batch.position_ids.unsqueeze(0)
            )
            for enc, rows in (encoder_outputs or {}).items():
                positions = batch.splice_positions[enc]
                if rows.shape[0] != positions.shape[0]:
                    raise ValueError(
                        f"{enc} encoder produced {rows.shape[0]} embeddings for "
                        f"{positions.shape[0]} placeholder positions"
                    )
                hidden = hidden.index_put((positions,), rows.to(hidden.dtype).unsqueeze(1))
        hidden = self.run_layers(hidden, batch.packed_seq_params())
        if not self.is_last:
            return hidden
        logits, _ = self.output_layer(hidden)
        loss = tensor_parallel.vocab_parallel_cross_entropy(
            logits.float(), batch.labels.unsqueeze(1)
        )
        return loss.view(-1)


def build_chunk(mllm: MLLMConfig, chunk: ChunkId, pg_collection) -> ModuleChunk:
    """Build the chunk of any module."""
    if chunk.module == "llm":
        return LanguageChunk(mllm, chunk, pg_collection)
    if chunk.module not in mllm.encoders:
        raise ValueError(f"the model has no {chunk.module} encoder")
    return EncoderChunk(mllm, chunk, pg_collection)
