# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Per-phase cost models: what one item of work costs in each phase of an iteration.

The balancer needs one number per *item* (an encoder unit, or a whole sample for the LLM) in
each phase ("vision", "audio", "llm"). For packed (varlen) execution an item is an independent
sequence of ``n`` tokens with its own attention, and costs::

    cost(n, out) = linear * n + quadratic * n**2 + const + per_output_token * out

``out`` is the number of LLM tokens the item leaves through the encoder's projector (0 for the
LLM phase, whose head is part of ``linear``). For padded execution a group of items runs as
``count`` sequences of one common length ``L`` (the group's longest item, or a fixed pad
length), and costs ``count * (linear * L + quadratic * L**2 + const)`` plus the projector on
the real output tokens.

Two sources of coefficients, chosen per phase:

* **FLOPs** (:meth:`PhaseCostModel.from_shape`), from :class:`~orchestration.model_shape.
  ModelShape`, the formula the trainer's logger and SEMU use as well. Training is forward plus
  backward (3x forward). ``linear`` = 3 x (layers x per-layer matmul FLOPs per token + the
  embedding before the first layer [+ the LM head, LLM only]); ``quadratic`` = 3 x layers x
  4 x hidden (scores and weighted sum), halved for the causal LLM; ``const`` = 0;
  ``per_output_token`` = 3 x the projector's forward FLOPs per output token. By construction
  ``cost(n, out) == ModelShape.phase_flops(phase, [n], out)``.
* **Seconds** (:meth:`PhaseCostModel.from_calibration`), from a
  :class:`~orchestration.calibration.Calibration`: the measured per-layer fit
  ``t(n) = const_s + linear_s n + quadratic_s n^2`` times the module's layer count, times
  ``1 + backward_ratio``; the measured ``edge_s_per_token`` (embedding, projector or head,
  forward) is charged per token of the module's input, also times ``1 + backward_ratio``.
  A calibration folds the projector into the edge term, so ``per_output_token`` is 0. The
  per-call ``const_s`` is left out: items are packed into one layer call per microbatch, so it
  is paid per call whichever items a rank holds; an item's fixed cost is the measured
  ``per_sequence_s`` (extra cost of one more packed sequence), when the file has it.
* **Fitted seconds** (``orchestration.cost_fit.OnlineCostFit.cost_model``): either of the
  above, refitted during training to the measured per-rank phase times. Only a fit sets
  ``per_call``, the cost a rank pays once per phase when it holds any item (its layer calls),
  which the per-phase planner adds to its predicted loads.

``unit`` says which ("flops" or "seconds"). Phases of one :class:`CostModel` should share a
unit when their costs are added (whole-sample mode, PP > 1); :meth:`CostModel.build` makes
sure of that by calibrating all phases or none.

Why the projector is charged to encoder units
---------------------------------------------
The projector runs once per LLM token an item produces, after the encoder. In per-phase mode
(PP = 1) it runs where the encoder ran, so it belongs to the encoder phase, item by item. An
item (image, clip) may be cut into several units (tiles, 30 s windows) that land on different
ranks, so its ``llm_tokens`` must be split between its units. We attribute each output row to
the unit that holds the *first* encoder token it pools (see ``megatron.mllm.batch.
pooling_pairs``: row ``r`` of an item with ``E`` encoder and ``K`` LLM tokens starts at token
``floor(r E / K)``). Unit ``u`` covering tokens ``[s, e)`` of its item is charged
``ceil(e K / E) - ceil(s K / E)`` rows: the pro-rata share rounded so that the units of an item
sum to exactly ``K``. :func:`unit_output_tokens` computes it vectorised. If a trainer instead
pools and projects at the LLM-phase owner, set ``per_output_token`` of the encoder phase to 0
and accept the (small) projector cost as unbalanced LLM-phase work.

Numbers: costs are float64 here; the balancer quantises them to integers (see
``orchestration.balance``) so that every sum it compares is exact on every rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from orchestration.calibration import Calibration, LayerTimeModel
from orchestration.model_shape import TRAIN_FLOPS_MULTIPLIER, ModelShape, TransformerShape
from orchestration.workload import PHASES

COST_UNITS: tuple[str, ...] = ("flops", "seconds")
"""The units a cost can be expressed in."""


@dataclass(frozen=True, slots=True)
class PhaseCostModel:
    """Cost of one independent sequence (item) of one phase, and of padded groups of them."""

    phase: str
    """"vision", "audio" or "llm"."""

    linear: float
    """Cost per token of the sequence."""

    quadratic: float
    """Cost per token squared of the sequence (attention scores and weighted sum)."""

    const: float = 0.0
    """Cost per sequence, whatever its length (kernel launches; 0 for FLOPs)."""

    per_output_token: float = 0.0
    """Cost per LLM token the item produces through the projector (encoders only)."""

    unit: str = "flops"
    """"flops" (derived from the model shape) or "seconds" (calibrated)."""

    padded: bool = False
    """Whether the phase executes its items padded to a common length rather than packed;
    the planner then balances with the exact padded algorithm."""

    pad_to: int | None = None
    """Fixed pad length of a padded phase; None pads each rank's group to its longest item."""

    per_call: float = 0.0
    """Cost each rank pays once when it holds any item of the phase (its layer calls, launch
    and Python overheads), whichever items they are. Fitted online from the timers
    (``orchestration.cost_fit``); 0 from FLOPs and calibrations. The per-phase planner adds it
    to its predicted loads; it never changes which items go together."""

    def __post_init__(self) -> None:
        if self.unit not in COST_UNITS:
            raise ValueError(
                f"{self.phase}: cost unit must be one of {COST_UNITS}, got {self.unit!r}"
            )
        for name in ("linear", "quadratic", "const", "per_output_token", "per_call"):
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(
                    f"{self.phase}: coefficient {name} must be finite and >= 0, got {value}"
                )
        if self.pad_to is not None and self.pad_to <= 0:
            raise ValueError(f"{self.phase}: pad_to must be positive, got {self.pad_to}")

    def item_cost(self, tokens: float, out_tokens: float = 0.0) -> float:
        """Cost of one independent sequence of ``tokens`` tokens, packed (no padding)."""
        n = float(tokens)
        return (
            self.linear * n
            + self.quadratic * n * n
            + self.const
            + self.per_output_token * float(out_tokens)
        )

    def item_costs(self, tokens: np.ndarray, out_tokens: np.ndarray | None = None) -> np.ndarray:
        """Vectorised :meth:`item_cost` over arrays of items (float64)."""
        n = np.asarray(tokens, dtype=np.float64)
        cost = self.linear * n + self.quadratic * n * n + self.const
        if out_tokens is not None and self.per_output_token:
            cost = cost + self.per_output_token * np.asarray(out_tokens, dtype=np.float64)
        return cost

    def padded_length_cost(self, length: float) -> float:
        """Cost of one sequence padded to ``length`` tokens (no projector term)."""
        n = float(length)
        return self.linear * n + self.quadratic * n * n + self.const

    def padded_cost(
        self, lengths: Iterable[int], pad_to: int | None = None, out_tokens: float = 0.0
    ) -> float:
        """Cost of a group of items executed padded: ``count * f(L)`` plus the projector.

        Args:
            lengths: tokens of each item of the group.
            pad_to: the common length; default ``self.pad_to``, else the longest item.
            out_tokens: real LLM tokens the group produces through the projector.

        Raises:
            ValueError: an item is longer than a fixed ``pad_to``.
        """
        lengths = [int(x) for x in lengths]
        if not lengths:
            return 0.0
        pad = pad_to if pad_to is not None else self.pad_to
        longest = max(lengths)
        if pad is not None and longest > pad:
            raise ValueError(f"{self.phase}: an item of {longest} tokens exceeds pad_to={pad}")
        length = longest if pad is None else pad
        return len(lengths) * self.padded_length_cost(length) + self.per_output_token * out_tokens

    def scaled(self, factor: float) -> "PhaseCostModel":
        """The same model with every coefficient multiplied by ``factor`` (> 0)."""
        return dataclasses.replace(
            self,
            linear=self.linear * factor,
            quadratic=self.quadratic * factor,
            const=self.const * factor,
            per_output_token=self.per_output_token * factor,
            per_call=self.per_call * factor,
        )

    @classmethod
    def from_shape(cls, shape: ModelShape, phase: str) -> "PhaseCostModel":
        """Training FLOPs coefficients of ``phase`` from the model shape.

        Raises:
            ValueError: the model has no such phase.
        """
        t = _transformer(shape, phase)
        groups_free = t.layer_linear_flops_per_token()
        linear = t.num_layers * groups_free + t.input_flops_per_token
        if phase == "llm":
            linear += t.output_flops_per_token
            out = 0.0
        else:
            out = t.output_flops_per_token
        # layer_attention_flops(n) = 4 n^2 h (halved when causal): read the coefficient off it
        # rather than restate the formula, so a change in ModelShape carries over.
        quad = t.layer_attention_flops(1) * t.num_layers
        m = float(TRAIN_FLOPS_MULTIPLIER)
        return cls(
            phase=phase,
            linear=m * linear,
            quadratic=m * quad,
            const=0.0,
            per_output_token=m * out,
            unit="flops",
        )

    @classmethod
    def from_calibration(
        cls, calibration: Calibration, shape: ModelShape, phase: str, strict: bool = True
    ) -> "PhaseCostModel":
        """Training-seconds coefficients of ``phase`` from measured per-layer times.

        Args:
            calibration: the measured per-layer fits, per module.
            shape: gives the number of layers of the module (and is checked against the sizes
                the calibration was measured with).
            phase: "vision", "audio" or "llm".
            strict: raise when the calibration names sizes (hidden size, heads, FFN) that
                differ from ``shape``'s.

        Raises:
            ValueError: the calibration lacks the module, or was measured on other sizes.
        """
        t = _transformer(shape, phase)
        if phase not in calibration.modules:
            raise ValueError(
                f"calibration ({calibration.device}) has no module {phase!r}; it has "
                f"{sorted(calibration.modules)}"
            )
        if strict:
            _check_calibrated_sizes(calibration, t, phase)
        fit: LayerTimeModel = calibration.modules[phase]
        train = 1.0 + fit.backward_ratio
        layers = t.num_layers
        # const_s is paid once per layer call, i.e. per packed microbatch, whichever items it
        # holds: it does not move with an item. What an extra packed sequence adds is
        # per_sequence_s (0 in files that do not measure it).
        per_sequence = float(getattr(fit, "per_sequence_s", 0.0) or 0.0)
        return cls(
            phase=phase,
            linear=train * (layers * fit.linear_s + fit.edge_s_per_token),
            quadratic=train * layers * fit.quadratic_s,
            const=train * layers * per_sequence,
            per_output_token=0.0,
            unit="seconds",
        )


def _transformer(shape: ModelShape, phase: str) -> TransformerShape:
    if phase == "llm":
        return shape.llm
    if phase not in shape.encoders:
        raise ValueError(f"the model has no phase {phase!r}; it has {['llm', *shape.encoders]}")
    return shape.encoders[phase]


def _check_calibrated_sizes(calibration: Calibration, t: TransformerShape, phase: str) -> None:
    measured = calibration.model.get(phase, {}) if isinstance(calibration.model, dict) else {}
    for key, value in (
        ("hidden_size", t.hidden_size),
        ("num_attention_heads", t.num_attention_heads),
        ("ffn_hidden_size", t.ffn_hidden_size),
    ):
        if key in measured and int(measured[key]) != int(value):
            raise ValueError(
                f"calibration ({calibration.device}) measured {phase} with {key}="
                f"{measured[key]}, but the model has {value}; recalibrate or pass strict=False"
            )


@dataclass(frozen=True, slots=True)
class CostModel:
    """The cost models of every phase of one model, in one unit."""

    phases: Mapping[str, PhaseCostModel]
    """Per phase ("vision", "audio", "llm"); an encoder the model lacks is absent."""

    @property
    def unit(self) -> str:
        """The common unit of the phases."""
        units = {p.unit for p in self.phases.values()}
        return units.pop() if len(units) == 1 else "mixed"

    def __getitem__(self, phase: str) -> PhaseCostModel:
        try:
            return self.phases[phase]
        except KeyError:
            raise KeyError(
                f"no cost model for phase {phase!r}; have {sorted(self.phases)}"
            ) from None

    def __contains__(self, phase: str) -> bool:
        return phase in self.phases

    @property
    def phase_order(self) -> tuple[str, ...]:
        """The phases present, in iteration order (encoders, then the LLM)."""
        return tuple(p for p in PHASES if p in self.phases)

    @classmethod
    def build(
        cls,
        shape: ModelShape,
        calibration: Calibration | None = None,
        *,
        padded: Mapping[str, int | None] | None = None,
        strict: bool = True,
    ) -> "CostModel":
        """FLOPs models for every phase of ``shape``, or seconds models from ``calibration``.

        Args:
            shape: the model.
            calibration: when given, every phase is calibrated (so the unit is common).
            padded: phases executed padded, each with its fixed pad length (None: pad to the
                longest item of each rank).
            strict: see :meth:`PhaseCostModel.from_calibration`.
        """
        if calibration is not None:
            # Times measured on another host, rescaled to this one (a no-op on the same host).
            from orchestration.host_probe import fit_to_host

            calibration = fit_to_host(calibration)
        phases = {}
        for phase in PHASES:
            if phase != "llm" and phase not in shape.encoders:
                continue
            if calibration is None:
                model = PhaseCostModel.from_shape(shape, phase)
            else:
                model = PhaseCostModel.from_calibration(calibration, shape, phase, strict=strict)
            if padded and phase in padded:
                model = dataclasses.replace(model, padded=True, pad_to=padded[phase])
            phases[phase] = model
        return cls(phases=phases)


def unit_output_tokens(
    unit_tokens: np.ndarray, unit_item: np.ndarray, item_llm_tokens: np.ndarray
) -> np.ndarray:
    """LLM tokens attributed to each encoder unit: the rows whose first pooled token it holds.

    Args:
        unit_tokens: (U,) encoder tokens of each unit; units of an item are consecutive, in order.
        unit_item: (U,) index of each unit's item, non-decreasing.
        item_llm_tokens: (I,) LLM tokens of each item.

    Returns:
        (U,) int64; the units of each item sum to exactly its ``llm_tokens``.
    """
    unit_tokens = np.asarray(unit_tokens, dtype=np.int64)
    unit_item = np.asarray(unit_item, dtype=np.int64)
    if unit_tokens.size == 0:
        return np.zeros(0, dtype=np.int64)
    k = np.asarray(item_llm_tokens, dtype=np.int64)[unit_item]
    # Units of one item are consecutive. An item of one unit gets all its tokens; the others
    # need the offsets of their units within the item.
    alone = (
        np.r_[True, unit_item[1:] != unit_item[:-1]] & np.r_[unit_item[1:] != unit_item[:-1], True]
    )
    if alone.all():
        return k
    out = k.copy()
    multi = np.flatnonzero(~alone)
    mt, mi = unit_tokens[multi], unit_item[multi]
    starts = np.flatnonzero(np.r_[True, mi[1:] != mi[:-1]])
    sizes = np.diff(np.r_[starts, mi.size])
    total = np.repeat(np.add.reduceat(mt, starts), sizes)
    csum = np.cumsum(mt)
    end = csum - np.repeat(csum[starts] - mt[starts], sizes)
    start = end - mt
    out[multi] = _ceil_div(end * k[multi], total) - _ceil_div(start * k[multi], total)
    return out


def _ceil_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return -(-a // b)
