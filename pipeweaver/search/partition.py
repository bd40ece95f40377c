# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The modality-aware partitioner (DIP section 3.1), offline: B_i, K_i and the layer splits.

From per-layer costs (a :class:`~orchestration.calibration.Calibration`'s measured times, else
the FLOPs of :class:`~orchestration.model_shape.ModelShape`) and a summary of the workload:

* **B_i**, per encoder: the smallest sub-microbatch, in units, whose throughput (units per
  second of one layer's forward and backward) is at least 95% of the best over 1 .. the most
  units a microbatch holds;
* **K_i**, per module: with T_i the whole module's forward and backward at B_i (the LLM's: one
  typical microbatch), the fastest module gets K = 1 and module i gets floor(T_i / T_1), capped
  so that each of its P x K_i chunks holds a layer;
* **the splits**: the P x K_i chunks of module i cut its layers contiguously so that the most
  expensive chunk (the input layer counted on chunk 0, the head on the last) costs least.

Chunk j of a module sits on rank j mod P (:meth:`PartitionPlan.placement`). Pure Python.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from orchestration.calibration import Calibration
from orchestration.model_shape import ModelShape
from orchestration.packing import balanced_contiguous_split
from orchestration.workload import SampleMeta
from pipeweaver.ir import MODULES, ScheduleError
from pipeweaver.placement import Placement, split_layers

KEEP_THROUGHPUT = 0.95
"""DIP's B_i rule: the smallest size within this fraction of the best throughput."""


@dataclass(frozen=True, slots=True)
class EncoderLoad:
    """What one encoder sees of the workload."""

    unit_tokens: int
    """Encoder tokens of a typical unit (the median unit)."""

    rows_per_unit: float
    """LLM rows the encoder's items produce per unit (the projector's work)."""

    max_units: int
    """Most units of this encoder in one microbatch: the largest sub-microbatch to try."""

    typical_units: int = 1
    """Units of this encoder in a typical microbatch that has any (the median)."""


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """The workload as the partitioner needs it, summarised from sample metadata."""

    encoders: Mapping[str, EncoderLoad]
    """Per encoder with units in the workload, its load."""

    llm_seq_lens: tuple[int, ...]
    """The packed LLM sequences of a typical microbatch (the median by LLM tokens)."""

    num_microbatches: int = 0
    """Microbatches summarised."""


def workload_shape(
    microbatches: Sequence[Sequence[SampleMeta]], encoders: Sequence[str]
) -> WorkloadShape:
    """Summarise microbatches of samples (e.g. the run's first iterations, Megatron's order).

    Raises:
        ValueError: no microbatches.
    """
    if not microbatches:
        raise ValueError("the partitioner needs at least one microbatch of the workload")
    loads = {}
    for enc in encoders:
        units, rows, per_mb = [], 0, []
        for mb in microbatches:
            items = [item for s in mb for item in s.encoder_items(enc)]
            units += [u for item in items for u in item.units]
            rows += sum(item.llm_tokens for item in items)
            per_mb.append(sum(len(item.units) for item in items))
        if units:
            loads[enc] = EncoderLoad(
                unit_tokens=int(statistics.median_low(units)),
                rows_per_unit=rows / len(units),
                max_units=max(per_mb),
                typical_units=int(statistics.median_low([n for n in per_mb if n])),
            )
    by_tokens = sorted(microbatches, key=lambda mb: (sum(s.llm_tokens for s in mb), len(mb)))
    typical = by_tokens[(len(by_tokens) - 1) // 2]
    return WorkloadShape(loads, tuple(s.llm_tokens for s in typical), len(microbatches))


class ModuleCosts(Protocol):
    """Forward plus backward cost of a module's parts, in :attr:`unit`."""

    unit: str
    """What a cost is measured in (``ms``, ``GFLOP``)."""

    def layer(self, module: str, seq_lens: Sequence[int]) -> float:
        """One transformer layer over independent sequences."""

    def input(self, module: str, seq_lens: Sequence[int]) -> float:
        """The input layer (embedding) over those sequences."""

    def head(self, module: str, seq_lens: Sequence[int], rows: int) -> float:
        """The head (an encoder's projector, producing ``rows`` LLM rows; the LLM's output)."""


class CalibratedCosts:
    """Measured milliseconds, from a calibration's per-module layer models, as SEMU charges
    them (:mod:`pipeweaver.semu.timing`): layers at their packed cost, the input layer and the
    head per token (the head also per LLM row), backward by its fit or by the ratio."""

    unit = "ms"

    def __init__(self, calibration: Calibration):
        self.tables = dict(calibration.modules)

    def covers(self, modules: Sequence[str]) -> bool:
        """Whether every module has a measured table."""
        return all(m in self.tables for m in modules)

    def layer(self, module: str, seq_lens: Sequence[int]) -> float:
        t = self.tables[module]
        return 1e3 * (t.forward_packed_s(seq_lens) + t.backward_packed_s(seq_lens))

    def input(self, module: str, seq_lens: Sequence[int]) -> float:
        t = self.tables[module]
        if t.input_s_per_token is None and t.head_s_per_token is None:
            return 0.0  # an old file's edge cost sits on the head
        tokens = sum(seq_lens)
        fwd = t.input_const_s + (t.input_s_per_token or 0.0) * tokens
        if t.input_backward_const_s is None:
            return 1e3 * fwd * (1.0 + t.backward_ratio)
        return 1e3 * (fwd + t.input_backward_const_s + t.input_backward_s_per_token * tokens)

    def head(self, module: str, seq_lens: Sequence[int], rows: int) -> float:
        t = self.tables[module]
        tokens = sum(seq_lens)
        if t.input_s_per_token is None and t.head_s_per_token is None:
            return 1e3 * t.edge_s_per_token * tokens * (1.0 + t.backward_ratio)
        fwd = t.head_const_s + (t.head_s_per_token or 0.0) * tokens + t.head_s_per_row * rows
        if t.head_backward_const_s is None:
            return 1e3 * fwd * (1.0 + t.backward_ratio)
        bwd = (
            t.head_backward_const_s
            + t.head_backward_s_per_token * tokens
            + t.head_backward_s_per_row * rows
        )
        return 1e3 * (fwd + bwd)


class FlopCosts:
    """Training GFLOPs from the model's shape (no fixed costs: every size is equally
    efficient, so B_i is 1 unit)."""

    unit = "GFLOP"

    def __init__(self, shape: ModelShape):
        self.shape = shape

    def layer(self, module: str, seq_lens: Sequence[int]) -> float:
        return 3e-9 * self.shape.module(module).forward_flops(seq_lens, layers=1)

    def input(self, module: str, seq_lens: Sequence[int]) -> float:
        return 3e-9 * sum(seq_lens) * self.shape.module(module).input_flops_per_token

    def head(self, module: str, seq_lens: Sequence[int], rows: int) -> float:
        out = sum(seq_lens) if module == "llm" else rows
        return 3e-9 * out * self.shape.module(module).output_flops_per_token


@dataclass(frozen=True, slots=True)
class SubSizeChoice:
    """How B_i was chosen for one encoder."""

    units: int
    """B_i: units per sub-microbatch."""

    throughput: float
    """Units per cost unit of one layer at B_i."""

    best_units: int
    """The size of the best throughput among those tried."""

    best_throughput: float
    """That best throughput."""

    tried: int
    """Sizes tried: 1 .. this."""


def choose_sub_microbatch(
    costs: ModuleCosts, module: str, load: EncoderLoad, keep: float = KEEP_THROUGHPUT
) -> SubSizeChoice:
    """B_i: the smallest number of units whose layer throughput is >= ``keep`` x the best.

    Throughput at b units is b / (one layer's forward + backward over b typical units), for b
    in 1 .. ``load.max_units``.
    """
    tried = max(1, load.max_units)
    rates = []
    for b in range(1, tried + 1):
        cost = costs.layer(module, [load.unit_tokens] * b)
        rates.append(b / cost if cost > 0 else math.inf)
    best = max(rates)
    best_units = rates.index(best) + 1
    units = next(b for b, r in enumerate(rates, 1) if r >= keep * best)
    return SubSizeChoice(units, rates[units - 1], best_units, best, tried)


def chunks_rule(latency: Mapping[str, float]) -> dict[str, int]:
    """DIP's K_i: the fastest module 1, module i floor(T_i / T_1) (at least 1)."""
    fastest = min(latency.values())
    if fastest <= 0:
        return {m: 1 for m in latency}
    # The relative slack keeps an exact ratio (3 T_1) from rounding down to 2.
    return {m: max(1, math.floor(t / fastest * (1 + 1e-9))) for m, t in latency.items()}


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """The partitioner's choices for a run, and why."""

    num_ranks: int
    """Pipeline ranks P."""

    chunks_per_stage: Mapping[str, int]
    """K_i per module present."""

    splits: Mapping[str, tuple[tuple[int, int], ...]]
    """Per module, the layer range of each of its P x K_i chunks."""

    sub_microbatch_units: Mapping[str, int]
    """B_i per encoder: units per sub-microbatch."""

    unit_tokens: Mapping[str, int]
    """Tokens of an encoder's typical unit (B_i in tokens is B_i x this)."""

    latency: Mapping[str, float]
    """T_i: the module's forward + backward at B_i (LLM: a typical microbatch)."""

    chunk_costs: Mapping[str, tuple[float, ...]]
    """Cost of each chunk of each module at that size."""

    sub_choices: Mapping[str, SubSizeChoice] = field(default_factory=dict)
    """How each automatic B_i was chosen."""

    auto: frozenset[str] = frozenset()
    """What was chosen here rather than given: ``chunks:<module>``, ``sub:<encoder>``."""

    split_by_cost: bool = True
    """Whether the layers were split by cost (else evenly by count)."""

    keep: float = KEEP_THROUGHPUT
    """The fraction of the best throughput an automatic B_i keeps."""

    given_sub: str = "given"
    """What a given B_i stands for (e.g. the units a typical microbatch holds)."""

    cost_unit: str = "ms"
    """Unit of every cost."""

    source: str = ""
    """Where the costs and the workload came from."""

    def sub_microbatch_tokens(self, encoder: str) -> int:
        """B_i in tokens of typical units."""
        return self.sub_microbatch_units[encoder] * self.unit_tokens.get(encoder, 0)

    def placement(self) -> Placement:
        """The layout: chunk j of each module on rank j mod P, its layers as split."""
        return Placement.from_splits(self.num_ranks, self.splits)

    def explain(self) -> list[str]:
        """Why: B_i against the best throughput, T_i, K_i = floor(T_i / T_1), the splits."""
        u = self.cost_unit
        lines = [f"partitioner: costs {self.source}"]
        for enc, b in self.sub_microbatch_units.items():
            how = self.given_sub
            choice = self.sub_choices.get(enc)
            if choice is not None:
                how = (
                    f"{choice.throughput / choice.best_throughput:.1%} of the best layer "
                    f"throughput (at {choice.best_units} of 1..{choice.tried} units tried, "
                    f">= {self.keep:.0%} kept)"
                )
            lines.append(
                f"  {enc}: sub-microbatch B = {b} unit{'s' if b != 1 else ''} "
                f"(~{self.sub_microbatch_tokens(enc)} tokens): {how}"
            )
        fastest = min(self.latency, key=lambda m: (self.latency[m], m))
        rule = chunks_rule(self.latency)
        parts = []
        for m, k in self.chunks_per_stage.items():
            why = f"T = {self.latency[m]:.4g} {u}"
            if f"chunks:{m}" in self.auto:
                why += f", floor(T / T_1) = {rule[m]}"
                if rule[m] > k:
                    why += ", capped to a layer per chunk"
            parts.append(f"{m} K = {k} ({why})")
        lines.append(f"  chunks per stage, T_1 = {fastest}: " + "; ".join(parts))
        how = "by cost" if self.split_by_cost else "evenly"
        for m, ranges in self.splits.items():
            cuts = " ".join(f"[{a},{b})" for a, b in ranges)
            costs = ", ".join(f"{c:.3g}" for c in self.chunk_costs[m])
            lines.append(f"  {m} layers {how}: {cuts} (chunk costs {costs} {u})")
        return lines


def _module_parts(
    costs: ModuleCosts, module: str, seq_lens: Sequence[int], rows: int, num_layers: int
) -> list[float]:
    """Cost of each layer, the input layer added to the first and the head to the last."""
    layer = costs.layer(module, seq_lens)
    parts = [layer] * num_layers
    parts[0] += costs.input(module, seq_lens)
    parts[-1] += costs.head(module, seq_lens, rows)
    return parts


def iteration_layer_costs(
    costs: ModuleCosts, layers: Mapping[str, int], microbatches: Sequence[Sequence[SampleMeta]]
) -> dict[str, list[float]]:
    """Each layer's cost summed over ``microbatches`` (the input layer's added to layer 0, the
    head's to the last): the weights of pipeline stages of balanced time
    (:meth:`~pipeweaver.placement.Placement.balanced_stages`).

    Every microbatch is costed with its own samples, not a typical one's: a layer's cost is not
    linear in its tokens (per-call constants), and an encoder runs only in the microbatches that
    hold its units.

    Args:
        costs: per-layer costs (:class:`CalibratedCosts` or :class:`FlopCosts`).
        layers: transformer layers per module present (0 = absent).
        microbatches: samples per microbatch (e.g. the run's first iterations).
    """
    out: dict[str, list[float]] = {}
    for module in MODULES:
        n = layers.get(module, 0)
        if n <= 0:
            continue
        total = [0.0] * n
        for mb in microbatches:
            if module == "llm":
                seq, rows = [s.llm_tokens for s in mb], 0
            else:
                items = [item for s in mb for item in s.encoder_items(module)]
                seq = [u for item in items for u in item.units]
                rows = sum(item.llm_tokens for item in items)
            if not seq:
                continue
            for i, c in enumerate(_module_parts(costs, module, seq, rows, n)):
                total[i] += c
        out[module] = total
    return out


def plan_partition(
    layers: Mapping[str, int],
    num_ranks: int,
    costs: ModuleCosts,
    workload: WorkloadShape,
    *,
    chunks_per_stage: Mapping[str, int | None] | None = None,
    sub_microbatch_units: Mapping[str, int | None] | None = None,
    keep: float = KEEP_THROUGHPUT,
    split_by_cost: bool = True,
    given_sub: str = "given",
    source: str = "",
) -> PartitionPlan:
    """DIP's offline partitioning of a model over ``num_ranks`` pipeline ranks.

    Args:
        layers: transformer layers per module present (``llm`` required; 0 = absent).
        num_ranks: P.
        costs: per-layer costs (:class:`CalibratedCosts` or :class:`FlopCosts`).
        workload: the workload's summary (:func:`workload_shape`).
        chunks_per_stage: K per module; a module missing or None is chosen by DIP's rule.
        sub_microbatch_units: B per encoder; missing or None is chosen by DIP's rule.
        keep: the fraction of the best throughput B_i keeps.
        split_by_cost: cut the layers by cost; False cuts them evenly by count
            (:func:`pipeweaver.placement.split_layers`, the layout of given chunk counts).
        given_sub: what the given B_i stand for, for :meth:`PartitionPlan.explain`.
        source: where the costs and the workload came from (for :meth:`PartitionPlan.explain`).

    Raises:
        ScheduleError: a module with fewer layers than ranks, or a given K that leaves a
            chunk without layers.
    """
    present = [m for m in MODULES if layers.get(m, 0) > 0]
    if "llm" not in present:
        raise ScheduleError("a placement needs the llm module")
    given_k = dict(chunks_per_stage or {})
    given_b = dict(sub_microbatch_units or {})
    auto: set[str] = set()
    subs, choices, unit_tokens, sizes = {}, {}, {}, {}
    for enc in present:
        if enc == "llm":
            continue
        load = workload.encoders.get(enc, EncoderLoad(1, 1.0, 1))
        unit_tokens[enc] = load.unit_tokens
        if given_b.get(enc) is None:
            choices[enc] = choose_sub_microbatch(costs, enc, load, keep)
            subs[enc] = choices[enc].units
            auto.add(f"sub:{enc}")
        else:
            subs[enc] = int(given_b[enc])
        seq = [load.unit_tokens] * subs[enc]
        sizes[enc] = (seq, round(load.rows_per_unit * subs[enc]))
    sizes["llm"] = (list(workload.llm_seq_lens) or [1], 0)
    latency = {m: sum(_module_parts(costs, m, *sizes[m], layers[m])) for m in present}
    rule = chunks_rule(latency)
    chunks, splits, chunk_costs = {}, {}, {}
    for m in present:
        most = layers[m] // num_ranks
        if most < 1:
            raise ScheduleError(
                f"the {m} module has {layers[m]} layers, fewer than the {num_ranks} pipeline "
                f"ranks its chunks span"
            )
        if given_k.get(m) is None:
            chunks[m] = min(rule[m], most)
            auto.add(f"chunks:{m}")
        else:
            chunks[m] = int(given_k[m])
            if chunks[m] > most:
                raise ScheduleError(
                    f"the {m} module's {layers[m]} layers cannot fill {num_ranks} x {chunks[m]} "
                    f"chunks"
                )
        parts = _module_parts(costs, m, *sizes[m], layers[m])
        if split_by_cost:
            ranges = balanced_contiguous_split(parts, num_ranks * chunks[m])
        else:
            ranges = split_layers(layers[m], num_ranks * chunks[m])
        splits[m] = tuple(ranges)
        chunk_costs[m] = tuple(sum(parts[a:b]) for a, b in ranges)
    return PartitionPlan(
        num_ranks=num_ranks,
        chunks_per_stage=chunks,
        splits=splits,
        sub_microbatch_units=subs,
        unit_tokens=unit_tokens,
        latency=latency,
        chunk_costs=chunk_costs,
        sub_choices=choices,
        auto=frozenset(auto),
        keep=keep,
        split_by_cost=split_by_cost,
        given_sub=given_sub,
        cost_unit=costs.unit,
        source=source,
    )
