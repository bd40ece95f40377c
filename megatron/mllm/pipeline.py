# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The model and data side of OrchWeave's pipeline runtime (``pipeweaver.runtime``).

- :class:`RuntimeModel` holds this rank's chunks of a :class:`pipeweaver.placement.Placement` (any
  module cut anywhere) as one megatron-core module, so megatron-core's DDP, optimizer and
  ``finalize_model_grads`` treat it like any stage model;
- :class:`RuntimeChunk` gives one chunk megatron-core's model contract (``set_input_tensor``,
  ``forward(batch)``), which is what the runtime drives through megatron-core's
  ``forward_step``/``backward_step``;
- :class:`PipelineMicrobatch` is a packed microbatch without padding (the runtime derives every
  shape from metadata) whose encoder units are split into sub-microbatches;
- :func:`schedule_function` picks the step's order: Megatron's 1F1B or interleaved 1F1B in the
  IR, or the dynamic greedy dual-queue interleaving with FLOPs-predicted compute durations
  (``pipeweaver.interleave.flops_durations``, which SEMU uses too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import Tensor, nn

from megatron.core.utils import make_viewless_tensor
from megatron.mllm.batch import (
    ChatTurns,
    EncoderInput,
    LanguageInput,
    PackedMicrobatch,
    SamplePayload,
    build_microbatch,
    split_encoder_input,
)
from megatron.mllm.chunks import EncoderChunk, ModuleChunk, build_chunk
from megatron.mllm.config import MLLMConfig
from megatron.mllm.layout_choice import RunLayout
from megatron.mllm.model import PlacedModel, module_layers
from orchestration.model_shape import ModelShape
from orchestration.packing import encoder_sub_groups
from orchestration.workload import SampleMeta
from pipeweaver.generators import interleaved_one_f_one_b, one_f_one_b
from pipeweaver.interleave import flops_durations, greedy_dual_queue
from pipeweaver.ir import Memory
from pipeweaver.placement import Placement
from pipeweaver.search.partition import PartitionPlan
from pipeweaver.semu.scenario import shape_layer_params

RUNTIME_SCHEDULES = ("1f1b", "interleaved", "dynamic")
"""``--pipeline-schedule`` values run by OrchWeave's runtime (``megatron`` is megatron-core's)."""


def runtime_placement(
    schedule: str,
    pp_size: int,
    mllm: MLLMConfig,
    chunks_per_stage: Mapping[str, int],
    partition: PartitionPlan | None = None,
    layout: str | None = None,
    layer_costs: Mapping[str, Sequence[float]] | None = None,
) -> Placement:
    """Where every chunk lives for a runtime schedule (``--pipeline-layout``, ``layout``; None:
    the schedule's default, ``interleaved`` for ``dynamic``, else ``baseline``).

    ``baseline`` is upstream Megatron's layout (encoders whole on stage 0, the LLM cut into P x K
    chunks round robin, K = ``chunks_per_stage["llm"]``, 1 for 1F1B); ``balanced`` cuts every
    layer, encoders first, into P x K consecutive stages of balanced parameters
    (:func:`pipeweaver.semu.scenario.shape_layer_params`, the placement SEMU simulates for
    ``--placement balanced``), ``balanced-cost`` the same by ``layer_costs``
    (:func:`megatron.mllm.partitioning.layer_costs`); ``interleaved`` (``dynamic`` only) cuts
    every module i into P x K_i chunks, chunk j on stage j mod P: evenly by layer count, or by
    measured cost as the partitioner split them (``partition``, with ``--*-chunks-per-stage
    auto``).

    Raises:
        ValueError: ``balanced-cost`` without ``layer_costs``.
    """
    layers = module_layers(mllm)
    layout = layout or ("interleaved" if schedule == "dynamic" else "baseline")
    if layout == "interleaved":
        if partition is not None:
            return partition.placement()
        return Placement.interleaved(pp_size, layers, chunks_per_stage)
    k = 1 if schedule == "1f1b" else chunks_per_stage.get("llm", 1)
    if layout == "balanced":
        return Placement.balanced_stages(pp_size, shape_layer_params(mllm.shape()), k)
    if layout == "balanced-cost":
        if layer_costs is None:
            raise ValueError("--pipeline-layout balanced-cost needs each layer's cost")
        return Placement.balanced_stages(pp_size, layer_costs, k)
    return Placement.baseline(pp_size, layers, llm_chunks_per_rank=k)


class RuntimeChunk(nn.Module):
    """One chunk with megatron-core's model contract, for the runtime's forward/backward steps.

    The chunk itself is owned (and registered) by :class:`RuntimeModel`; this wrapper only routes
    the runtime's input tensors: the previous chunk's output, or for LLM chunk 0 the projected
    rows of every encoder sub in ``PipelineMicrobatch.parts()`` order.
    """

    def __init__(self, chunk: ModuleChunk):
        super().__init__()
        self._chunk = [chunk]  # a list, so the chunk is not registered twice
        self._inputs: list = []

    @property
    def chunk(self) -> ModuleChunk:
        """The wrapped chunk."""
        return self._chunk[0]

    def parameters(self, recurse: bool = True):
        """The wrapped chunk's parameters (the runtime declares them final after the chunk's
        last backward: ``config.grad_sync_func``)."""
        return self.chunk.parameters(recurse)

    def set_input_tensor(self, tensors) -> None:
        """megatron-core's hook: this chunk's input tensors."""
        self._inputs = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]

    def forward(self, batch: "ComputeBatch") -> Tensor:
        """Run the chunk on its share of a microbatch."""
        chunk = self.chunk
        mb = batch.microbatch
        if isinstance(chunk, EncoderChunk):
            sub = mb.sub_input(chunk.chunk_id.module, batch.sub)
            hidden = None if chunk.is_first else self._inputs[0]
            out = chunk.body(hidden, sub.features, sub.positions, sub.packed_seq_params())
            if chunk.is_last:
                # The runtime frees the data of chunk outputs (megatron-core's
                # deallocate_pipeline_outputs), which a view would defeat.
                out = make_viewless_tensor(chunk.head(out.squeeze(1), sub), True, True)
            return out
        if chunk.is_first:
            rows: dict[str, list[Tensor]] = {}
            for (encoder, _), tensor in zip(mb.parts(), self._inputs):
                rows.setdefault(encoder, []).append(tensor)
            outputs = {e: torch.cat(parts) for e, parts in rows.items()}
            return chunk(None, mb.language, outputs)
        return chunk(self._inputs[0], mb.language)


class RuntimeModel(PlacedModel):
    """This rank's chunks of a placement (any module cut anywhere), for the runtime."""

    def __init__(self, mllm: MLLMConfig, placement: Placement, pp_rank: int, pg_collection):
        super().__init__(mllm, placement, pp_rank)
        self.partition: PartitionPlan | None = None
        """The partitioner's plan this placement came from, if any (set by its builder)."""
        self.run_layout: RunLayout | None = None
        """``--pipeline-layout`` as it resolved (and, with ``auto``, why), for the setup line
        (set by its builder)."""
        self.chunks = nn.ModuleDict()
        self._chunk_modules: dict[tuple[str, int], RuntimeChunk] = {}
        for (module, c), cid in zip(placement.chunks_on(pp_rank), self.chunk_ids()):
            chunk = build_chunk(mllm, cid, pg_collection)
            self.chunks[f"{module}_{c}"] = chunk
            self._chunk_modules[(module, c)] = RuntimeChunk(chunk)
        last_llm = placement.num_chunks("llm") - 1
        self.pre_process = ("llm", 0) in self._chunk_modules
        self.post_process = ("llm", last_llm) in self._chunk_modules

    def describe(self) -> str:
        """The layout for the setup line."""
        encoders = ", ".join(
            f"{n}: {e.num_layers} layers x {e.hidden_size}" for n, e in self.mllm.encoders.items()
        )
        lang = self.mllm.language
        text = f"encoders: {encoders} | LLM {lang.num_layers} layers x {lang.hidden_size}"
        if self.run_layout is None:
            return text
        costs = self.run_layout.layer_costs
        total = sum(sum(c) for c in costs.values()) if costs is not None else 0.0
        stages = []
        for rank in range(self.placement.num_ranks):
            held, cost = [], 0.0
            for module, c in self.placement.chunks_on(rank):
                a, b = self.placement.layer_range(module, c)
                held.append(f"{module} [{a},{b})")
                cost += sum(costs[module][a:b]) if costs is not None else 0.0
            share = f" ({cost / total:.0%} of the cost)" if total > 0 else ""
            stages.append(f"{rank}: {' '.join(held)}{share}")
        source = f" (costs: {self.run_layout.costs_source})" if costs is not None else ""
        text = f"{text} | {self.run_layout.layout} stages{source}: {'; '.join(stages)}"
        choice = self.run_layout.choice
        return f"{text} | {choice.describe()}" if choice is not None else text

    def chunk_module(self, module: str, chunk: int) -> RuntimeChunk:
        """The runtime's view of one chunk on this rank."""
        return self._chunk_modules[(module, chunk)]

    def set_input_tensor(self, input_tensor) -> None:
        """Inputs go to individual chunks (:meth:`chunk_module`), never to the container."""

    def global_param_names(self) -> dict[str, str]:
        """Local parameter name -> layout-independent name."""
        names = {}
        for key, chunk in self.chunks.items():
            for local, _ in chunk.named_parameters():
                names[f"chunks.{key}.{local}"] = chunk.global_name(local)
        return names


@dataclass
class ComputeBatch:
    """What ``forward_step_func`` gets for one compute: the microbatch and the compute's place."""

    microbatch: "PipelineMicrobatch"
    """The microbatch."""

    module: str
    """The compute's module."""

    chunk: int
    """The compute's chunk."""

    sub: int
    """The compute's sub-microbatch (0 for the LLM)."""

    @property
    def language(self) -> LanguageInput:
        """The LLM inputs (the loss function reads the loss mask here)."""
        return self.microbatch.language


class PipelineMicrobatch:
    """A packed microbatch for the runtime: no padding, encoder units in sub-microbatches."""

    def __init__(self, packed: PackedMicrobatch, subs: dict[str, list[EncoderInput]],
                 hidden_sizes: dict[str, int]):  # fmt: skip
        self.packed = packed
        self.subs = subs
        self.hidden_sizes = hidden_sizes

    @property
    def language(self) -> LanguageInput:
        """The LLM's inputs."""
        return self.packed.language

    def num_subs(self, encoder: str) -> int:
        """Subs of an encoder here (0 without units)."""
        return len(self.subs.get(encoder, ()))

    def parts(self) -> list[tuple[str, int]]:
        """``(encoder, sub)`` of every encoder sub, in the order LLM chunk 0 receives them."""
        return [(e, s) for e in self.hidden_sizes if e != "llm" for s in range(self.num_subs(e))]

    def sub_input(self, encoder: str, sub: int) -> EncoderInput:
        """One sub-microbatch's encoder inputs."""
        return self.subs[encoder][sub]

    def output_shape(self, module: str, sub: int, last_chunk: bool) -> tuple[int, ...]:
        """Shape of a chunk's output (the runtime sizes its receive buffers with it)."""
        if module == "llm":
            return (self.language.length, 1, self.hidden_sizes["llm"])
        sub_input = self.subs[module][sub]
        if last_chunk:
            return (sub_input.num_rows, self.hidden_sizes["llm"])
        return (sub_input.num_tokens, 1, self.hidden_sizes[module])

    def compute_sequences(self, module: str, sub: int) -> tuple[Sequence[int], int]:
        """The sequences a compute of ``module`` on sub ``sub`` runs over, and the LLM rows the
        sub projects (0 for the LLM): what ``pipeweaver.interleave.flops_durations`` reads."""
        if module == "llm":
            return self.language.seq_lens, 0
        sub_input = self.sub_input(module, sub)
        return sub_input.unit_lens, sub_input.num_rows

    def compute_batch(self, module: str, chunk: int, sub: int) -> ComputeBatch:
        """The batch ``forward_step_func`` receives for one compute."""
        return ComputeBatch(self, module, chunk, sub)


def _encoder_items(samples: Sequence[tuple[SampleMeta, SamplePayload]], encoder: str):
    """``(units, tokens, rows)`` of each item of ``encoder`` in a microbatch, in packing order."""
    return [
        (len(item.units), item.encoder_tokens, item.llm_tokens)
        for meta, _ in samples
        for item in meta.encoder_items(encoder)
    ]


def build_pipeline_microbatch(
    samples: Sequence[tuple[SampleMeta, SamplePayload]],
    mllm: MLLMConfig,
    device,
    with_features: bool,
    sub_tokens: int | None,
    sub_units: Mapping[str, int] | None = None,
    chat_turns: ChatTurns | None = None,
) -> PipelineMicrobatch:
    """Pack samples for the runtime (no padding) and cut each encoder's items into subs: of at
    most ``sub_tokens`` tokens, or (``sub_units``, B_i per encoder) ceil(N_i / B_i) near-equal
    subs of its N_i units, as SEMU cuts them (:func:`orchestration.packing.encoder_sub_groups`).
    ``chat_turns`` masks the loss as :func:`~megatron.mllm.batch.build_microbatch` does."""
    encoders = list(mllm.encoders)
    packed = build_microbatch(
        samples, encoders, device=device, with_features=with_features, chat_turns=chat_turns
    )
    subs = {}
    for enc, enc_input in packed.encoders.items():
        items = _encoder_items(samples, enc)
        groups = encoder_sub_groups(items, sub_tokens, (sub_units or {}).get(enc))
        subs[enc] = split_encoder_input(enc_input, items, groups)
    sizes = {e: c.hidden_size for e, c in mllm.encoders.items()}
    sizes["llm"] = mllm.language.hidden_size
    return PipelineMicrobatch(packed, subs, sizes)


def schedule_function(name: str, shape: ModelShape, memory: Memory = Memory.NONE):
    """The runtime's schedule function for ``--pipeline-schedule name``."""
    if name == "1f1b":
        return lambda placement, structure, mbs: one_f_one_b(placement, structure, memory)
    if name == "interleaved":
        return lambda placement, structure, mbs: interleaved_one_f_one_b(
            placement, structure, memory
        )
    if name == "dynamic":
        return lambda placement, structure, mbs: greedy_dual_queue(
            placement, structure, flops_durations(shape, placement, mbs), memory=memory
        )
    raise ValueError(f"unknown runtime schedule {name!r}; expected one of {RUNTIME_SCHEDULES}")
