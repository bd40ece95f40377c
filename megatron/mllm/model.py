# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The upstream-Megatron placement: what one pipeline stage holds, as a megatron-core model.

As in Megatron's LLaVA, every encoder (and its projector) sits on the first pipeline stage and
the LLM layers are split evenly over the stages. The stage model follows megatron-core's model
contract (``set_input_tensor``, ``model_type``, ``config``), so megatron-core's own
``get_forward_backward_func()`` schedules drive it unchanged.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from megatron.core.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from megatron.mllm.batch import PackedMicrobatch
from megatron.mllm.chunks import ChunkId, EncoderChunk, LanguageChunk, build_chunk
from megatron.mllm.config import MLLMConfig


def baseline_stage_chunks(mllm: MLLMConfig, pp_rank: int, pp_size: int) -> list[ChunkId]:
    """Chunks of one stage under the baseline placement: encoders whole on stage 0, LLM even.

    Raises:
        ValueError: the LLM layers do not split evenly over the stages.
    """
    layers = mllm.num_layers("llm")
    if layers % pp_size != 0:
        raise ValueError(
            f"--num-layers {layers} is not divisible by --pipeline-model-parallel-size {pp_size}"
        )
    per = layers // pp_size
    chunks = []
    if pp_rank == 0:
        chunks += [ChunkId(e, 0, mllm.num_layers(e)) for e in mllm.encoders]
    chunks.append(ChunkId("llm", pp_rank * per, (pp_rank + 1) * per))
    return chunks


class PipelineStageModel(MegatronModule):
    """The chunks of one pipeline stage, run in order on a microbatch.

    On the first stage the forward runs every encoder on the microbatch's units, then the first
    LLM chunk on the spliced sequence; on later stages it runs its LLM chunk on the activation
    that megatron-core's schedule passes in through :meth:`set_input_tensor`. The last stage
    returns the per-token loss ``[S]``; the others the hidden states ``[S, 1, h]``.
    """

    def __init__(self, mllm: MLLMConfig, chunks: list[ChunkId], pg_collection):
        super().__init__(config=mllm.language)
        self.model_type = ModelType.encoder_or_decoder
        # The LLM's input embedding and output layer are separate parameters (no tying), so
        # megatron-core's finalize_model_grads has no embedding to sync between stages.
        self.share_embeddings_and_output_weights = False
        self.mllm = mllm
        self.chunk_ids = chunks
        self.encoders = nn.ModuleDict()
        language: Optional[LanguageChunk] = None
        for cid in chunks:
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
        """Run this stage on one microbatch."""
        if self.pre_process:
            outputs = {
                name: encoder(None, batch.encoders[name])
                for name, encoder in self.encoders.items()
                if name in batch.encoders
            }
            return self.language(None, batch.language, outputs)
        return self.language(self.input_tensor, batch.language)
