# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The upstream-Megatron placement: what one pipeline stage holds, as a megatron-core model.

As in Megatron's LLaVA, every encoder (and its projector) sits on the first pipeline stage and
the LLM layers are split evenly over the stages (``pipeweaver.placement.Placement.baseline``).
The stage model follows megatron-core's model contract (``set_input_tensor``, ``model_type``,
``config``), so megatron-core's own ``get_forward_backward_func()`` schedules drive it
unchanged. :class:`PlacedModel` is what it shares with the runtime's model
(``megatron.mllm.pipeline.RuntimeModel``): the chunks of one rank of a placement.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from megatron.core.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from megatron.mllm.batch import PackedMicrobatch
from megatron.mllm.chunks import ChunkId, EncoderChunk, LanguageChunk, ModuleChunk, build_chunk
from megatron.mllm.config import MLLMConfig
from pipeweaver.placement import Placement


def module_layers(mllm: MLLMConfig) -> dict[str, int]:
    """Layers of every module of the model, for its placements."""
    return {m: mllm.num_layers(m) for m in (*mllm.encoders, "llm")}


class PlacedModel(MegatronModule):
    """This rank's chunks of a :class:`~pipeweaver.placement.Placement`, as one module that
    megatron-core's DDP, optimizer and ``finalize_model_grads`` treat like any stage model."""

    def __init__(self, mllm: MLLMConfig, placement: Placement, pp_rank: int):
        super().__init__(config=mllm.language)
        self.model_type = ModelType.encoder_or_decoder
        # The LLM's input embedding and output layer are separate parameters (no tying), so
        # megatron-core's finalize_model_grads has no embedding to sync between stages.
        self.share_embeddings_and_output_weights = False
        self.mllm = mllm
        self.placement = placement
        self.pp_rank = pp_rank

    def chunk_ids(self) -> list[ChunkId]:
        """The layers this rank holds, chunk by chunk."""
        return [
            ChunkId(m, *self.placement.layer_range(m, c))
            for m, c in self.placement.chunks_on(self.pp_rank)
        ]

    @property
    def holds_encoder_inputs(self) -> bool:
        """Whether this rank runs an encoder's input layer (and so needs its features)."""
        return any(self.placement.rank_of(e, 0) == self.pp_rank for e in self.placement.encoders)

    def forward_parameters(self) -> list[nn.Parameter]:
        """This rank's parameters chunk by chunk (in the order the chunks are registered: the
        encoders before the LLM), each chunk's in the order its forward uses them."""
        return [p for m in self.modules() if isinstance(m, ModuleChunk)
                for p in m.forward_parameters()]  # fmt: skip

    def layout(self) -> list[str]:
        """``module chunk:start-stop`` of every chunk here, as checkpoints record them."""
        return [
            f"{m}{c}:{a}-{b}"
            for m, c in self.placement.chunks_on(self.pp_rank)
            for a, b in [self.placement.layer_range(m, c)]
        ]


class PipelineStageModel(PlacedModel):
    """The chunks of one pipeline stage, run in order on a microbatch.

    On the first stage the forward runs every encoder on the microbatch's units, then the first
    LLM chunk on the spliced sequence; on later stages it runs its LLM chunk on the activation
    that megatron-core's schedule passes in through :meth:`set_input_tensor`. The last stage
    returns the per-token loss ``[S]``; the others the hidden states ``[S, 1, h]``.
    """

    def __init__(self, mllm: MLLMConfig, pp_rank: int, pp_size: int, pg_collection):
        super().__init__(mllm, Placement.baseline(pp_size, module_layers(mllm)), pp_rank)
        self.encoders = nn.ModuleDict()
        language: Optional[LanguageChunk] = None
        for cid in self.chunk_ids():
            module = build_chunk(mllm, cid, pg_collection)
            if isinstance(module, EncoderChunk):
                if not (module.is_first and module.is_last):
                    raise ValueError(f"the baseline placement keeps encoders whole, got {cid}")
                self.encoders[cid.module] = module
            else:
                if language is not None:
                    raise ValueError("a baseline stage holds one LLM chunk")
                language = module
        if language is None:
            raise ValueError("a baseline stage needs an LLM chunk")
        self.language = language
        self.pre_process = language.is_first
        self.post_process = language.is_last
        self.input_tensor: Optional[Tensor] = None

    def set_input_tensor(self, input_tensor) -> None:
        """megatron-core's hook: the activation received from the previous stage."""
        if isinstance(input_tensor, (list, tuple)):
            input_tensor = input_tensor[0] if input_tensor else None
        self.input_tensor = input_tensor

    def global_param_names(self) -> dict[str, str]:
        """Local parameter name -> layout-independent name, for checkpoints and comparisons."""
        names = {}
        for prefix, chunk in [("language.", self.language)] + [
            (f"encoders.{k}.", v) for k, v in self.encoders.items()
        ]:
            for local, _ in chunk.named_parameters():
                names[prefix + local] = chunk.global_name(local)
        return names

    def forward(self, batch: PackedMicrobatch) -> Tensor:
        """Run this stage on one microbatch.

        An encoder whose units' final hidden states the batch already carries
        (``batch.encoder_hidden``: the per-phase balanced step runs encoder bodies elsewhere)
        runs only its head here: pooling and the projector need whole items.
        """
        if self.pre_process:
            outputs = {}
            for name, encoder in self.encoders.items():
                if name not in batch.encoders:
                    continue
                hidden = batch.encoder_hidden.get(name)
                if hidden is None:
                    outputs[name] = encoder(None, batch.encoders[name])
                else:
                    outputs[name] = encoder.head(hidden, batch.encoders[name])
            return self.language(None, batch.language, outputs)
        return self.language(self.input_tensor, batch.language)

    def describe(self) -> str:
        """The layout for the setup line."""
        encoders = ", ".join(
            f"{n}: {e.num_layers} layers x {e.hidden_size}" for n, e in self.mllm.encoders.items()
        )
        lang = self.mllm.language
        per = lang.num_layers // self.placement.num_ranks
        return (
            f"encoders on stage 0 ({encoders}) | LLM {lang.num_layers} layers x "
            f"{lang.hidden_size}, {per} per stage"
        )
