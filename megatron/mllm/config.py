# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Configuration of the multimodal model: the LLM's megatron-core config plus the encoders."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

import torch

from megatron.core.transformer.transformer_config import TransformerConfig
from orchestration.model_shape import ModelShape, TransformerShape

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of one encoder (vision or audio)."""

    name: str
    """Phase name: "vision" or "audio"."""

    num_layers: int
    """Transformer layers."""

    hidden_size: int
    """Width."""

    num_attention_heads: int
    """Attention heads."""

    ffn_hidden_size: int
    """MLP inner width."""

    input_dim: int
    """Features per input token: 3 x p x p pixels per patch, or mel bins per audio frame."""


@dataclass
class MLLMConfig:
    """Everything needed to build any chunk of the multimodal model on any rank."""

    language: TransformerConfig
    """megatron-core config of the LLM (Megatron's flags), with the real pipeline size."""

    vocab_size: int
    """Padded vocabulary size of the LLM."""

    max_sequence_length: int
    """Positions of the LLM's learned position embedding."""

    encoders: dict[str, EncoderConfig] = field(default_factory=dict)
    """Encoders by phase name; an encoder with no layers is absent."""

    projector_type: str = "mlp"
    """``mlp`` or ``affine``: megatron-core's MultimodalProjector types."""

    use_te: bool = False
    """Build Transformer Engine layer specs instead of the local ones."""

    init_seed: int = 1234
    """Seed of the layout-independent parameter initialisation."""

    def num_layers(self, module: str) -> int:
        """Layers of a module."""
        return self.language.num_layers if module == "llm" else self.encoders[module].num_layers

    def chunk_config(self, module: str, num_layers: int) -> TransformerConfig:
        """A megatron-core config for a chunk of ``num_layers`` layers of ``module``.

        The chunk sees itself as a whole, unpipelined model: OrchWeave places chunks on stages
        itself, so megatron-core must not offset or split the layers again.
        """
        overrides: dict = dict(
            num_layers=num_layers,
            pipeline_model_parallel_size=1,
            virtual_pipeline_model_parallel_size=None,
            num_layers_in_first_pipeline_stage=None,
            num_layers_in_last_pipeline_stage=None,
            pipeline_model_parallel_layout=None,
            account_for_embedding_in_pipeline_split=False,
            account_for_loss_in_pipeline_split=False,
        )
        if module != "llm":
            enc = self.encoders[module]
            overrides.update(
                hidden_size=enc.hidden_size,
                num_attention_heads=enc.num_attention_heads,
                num_query_groups=enc.num_attention_heads,
                ffn_hidden_size=enc.ffn_hidden_size,
                kv_channels=enc.hidden_size // enc.num_attention_heads,
            )
        return dataclasses.replace(self.language, **overrides)

    def projector_config(self, module: str) -> TransformerConfig:
        """Config of an encoder's projector: it outputs LLM-width embeddings."""
        return self.chunk_config("llm", 1)

    def shape(self) -> ModelShape:
        """The sizes of the model that decide its costs: FLOPs (balancer, TFLOP/s), parameters
        and bytes (SEMU). The one derivation every part of OrchWeave uses."""
        lang = self.language
        v = self.vocab_size
        # What every module shares with the LLM: the MLP type, biases, the norms.
        common = dict(
            gated_mlp=bool(lang.gated_linear_unit),
            add_bias_linear=bool(lang.add_bias_linear),
            normalization=str(lang.normalization),
        )
        llm = TransformerShape(
            num_layers=lang.num_layers,
            hidden_size=lang.hidden_size,
            ffn_hidden_size=lang.ffn_hidden_size,
            num_attention_heads=lang.num_attention_heads,
            num_query_groups=lang.num_query_groups,
            causal=True,
            output_flops_per_token=2.0 * lang.hidden_size * v,
            embedding_params=(v + self.max_sequence_length) * lang.hidden_size,
            **common,
        )
        encoders = {}
        for name, enc in self.encoders.items():
            # The MLP projector maps the encoder's width to the LLM's through the LLM's FFN width.
            if self.projector_type == "mlp":
                proj = 2.0 * (enc.hidden_size + lang.hidden_size) * lang.ffn_hidden_size
            else:
                proj = 2.0 * enc.hidden_size * lang.hidden_size
            encoders[name] = TransformerShape(
                num_layers=enc.num_layers,
                hidden_size=enc.hidden_size,
                ffn_hidden_size=enc.ffn_hidden_size,
                num_attention_heads=enc.num_attention_heads,
                causal=False,
                input_flops_per_token=2.0 * enc.input_dim * enc.hidden_size,
                output_flops_per_token=proj,
                **common,
            )
        dtype_bytes = 2 if lang.bf16 or lang.fp16 else 4
        return ModelShape(llm=llm, encoders=encoders, params_dtype_bytes=dtype_bytes)


def mllm_config(run) -> MLLMConfig:
    """Build the model config of a :class:`~megatron.mllm.run_config.RunConfig`: the LLM's
    megatron-core config from Megatron's flags, the encoders from OrchWeave's."""
    from megatron.mllm import cpu_shim
    from megatron.training.argument_utils import core_transformer_config_from_args

    args = run.args
    language = core_transformer_config_from_args(args)
    # Samples move between microbatches and ranks; only a loss normalised by the global number
    # of loss tokens is independent of where each sample lands.
    language.calculate_per_token_loss = True
    # Our own initialisation (megatron.mllm.init) gives every layer the same weights whatever
    # the layout, so megatron-core's per-rank init is skipped.
    language.perform_initialization = False
    if not cpu_shim.cuda_available():
        language.use_cpu_initialization = True
    use_te = _use_transformer_engine(args)
    if language.gradient_accumulation_fusion and not _have_fused_wgrad():
        logger.debug(
            "apex's fused_weight_gradient_mlp_cuda is not importable: "
            "gradient accumulation fusion is off"
        )
        language.gradient_accumulation_fusion = False
    if not use_te:
        # Persistent layer norm is a fused apex/TE kernel; torch's LayerNorm has none.
        language.persist_layer_norm = False
    inputs = run.multimodal
    input_dims = {"vision": 3 * inputs.vision_patch_size**2, "audio": inputs.audio_feature_dim}
    encoders = {
        name: EncoderConfig(
            name=name,
            num_layers=enc.num_layers,
            hidden_size=enc.hidden_size,
            num_attention_heads=enc.num_attention_heads,
            ffn_hidden_size=enc.ffn_hidden_size,
            input_dim=input_dims[name],
        )
        for name, enc in run.encoders.items()
    }
    return MLLMConfig(
        language=language,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings or args.seq_length,
        encoders=encoders,
        projector_type=inputs.projector_type,
        use_te=use_te,
        init_seed=run.seed,
    )


def _have_fused_wgrad() -> bool:
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def _use_transformer_engine(args) -> bool:
    if args.transformer_impl != "transformer_engine":
        return False
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        logger.debug("Transformer Engine is not importable: using the local layer specs")
        return False
    if not torch.cuda.is_available():
        logger.debug("no CUDA device: using the local layer specs")
        return False
    return True
