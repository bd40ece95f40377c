# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Per-phase costs fitted online to the measured phase times, so the planner balances time.

Pure numpy. A FLOPs cost model balances FLOPs, but a rank's phase time also holds per-call
and per-sequence overheads that FLOPs do not see (on a small model they dominate), and a
calibration was measured on another, quieter machine. So after every iteration each phase's
measured per-rank times (gathered: every rank holds the same values) are set beside the work
each rank did in that phase, its *features* (:func:`phase_features`)::

    calls       1 if the rank held any item of the phase, else 0   -> per_call
    items       its items (encoder units, or samples for the LLM)   -> const
    tokens      the sum of their tokens                              -> linear
    tokens_sq   the sum of their tokens squared                      -> quadratic
    out_tokens  the sum of their LLM output tokens (encoders only)   -> per_output_token

and :class:`OnlineCostFit` fits the five coefficients of :class:`~orchestration.cost_model.
PhaseCostModel` (``per_call`` included) to them with :class:`~orchestration.robust_fit.
OnlineLinearFit`: a window of recent iterations, a warm-up, Huber weights, non-negative
coefficients, a ridge toward the starting model, a bounded step per update and quantised
coefficients. The starting model (FLOPs, or calibrated seconds) is the prior; each update
first fits one scale per phase, the median ratio of measured to predicted time, that turns
its coefficients into seconds (for a FLOPs model, seconds per FLOP; for a calibration, how much
slower this run is than the calibration), and the ridge pulls toward the scaled prior.

For a padded phase the features are those of its padded execution: ``count`` sequences of the
rank's common length ``L`` give ``items = count``, ``tokens = count L``, ``tokens_sq =
count L^2``.

Usage on every rank, with the same gathered timer values::

    fit = OnlineCostFit(CostModel.build(shape, calibration))
    plan = plan_iteration(md, fit.cost_model(), ...)
    ...                                                        # the step runs the plan
    for p in plan.phases:
        fit.observe(iteration, p.phase, fit.features(p), seconds[p.phase])   # (R,) seconds
    log(fit.describe())
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from orchestration.cost_model import CostModel, PhaseCostModel
from orchestration.metadata import PhaseItems
from orchestration.phase_plan import PhasePlan
from orchestration.robust_fit import FitConfig, OnlineLinearFit, format_seconds, quantize

FEATURES: tuple[str, ...] = ("calls", "items", "tokens", "tokens_sq", "out_tokens")
"""The columns of :func:`phase_features`, in the order of :func:`model_coefficients`."""

COEFFICIENTS: tuple[str, ...] = ("per_call", "const", "linear", "quadratic", "per_output_token")
"""The :class:`PhaseCostModel` field each feature's coefficient is."""


def model_coefficients(model: PhaseCostModel) -> np.ndarray:
    """(5,) ``model``'s coefficients in :data:`FEATURES` order."""
    return np.array([getattr(model, name) for name in COEFFICIENTS], dtype=np.float64)


def rank_features(
    items: PhaseItems, ranks: np.ndarray, num_ranks: int, model: PhaseCostModel | None = None
) -> np.ndarray:
    """(R, 5) :data:`FEATURES` of each rank when item ``i`` runs on ``ranks[i]``.

    Args:
        items: the phase's items.
        ranks: (n,) the rank computing each item.
        num_ranks: R.
        model: the phase's cost model; a padded one gives the padded features.
    """
    r = int(num_ranks)
    ranks = np.asarray(ranks, dtype=np.int64)
    count = np.bincount(ranks, minlength=r).astype(np.float64)
    out = np.bincount(ranks, weights=items.out_tokens.astype(np.float64), minlength=r)
    if model is not None and model.padded:
        if model.pad_to is not None:
            length = np.where(count > 0, float(model.pad_to), 0.0)
        else:
            length = np.zeros(r)
            np.maximum.at(length, ranks, items.tokens.astype(np.float64))
        tokens, tokens_sq = count * length, count * length * length
    else:
        n = items.tokens.astype(np.float64)
        tokens = np.bincount(ranks, weights=n, minlength=r)
        tokens_sq = np.bincount(ranks, weights=n * n, minlength=r)
    return np.stack([(count > 0).astype(np.float64), count, tokens, tokens_sq, out], axis=1)


def phase_features(
    plan: PhasePlan, model: PhaseCostModel | None = None, *, ordinary: bool = False
) -> np.ndarray:
    """(R, 5) :data:`FEATURES` of each rank under a phase's plan.

    Args:
        plan: the phase's plan (its ``dispatch`` says where each item ran).
        model: the phase's cost model, for padded phases (see :func:`rank_features`).
        ordinary: the features of the ordinary assignment instead (items on their loading
            rank), e.g. to predict what not balancing would have cost.
    """
    ranks = plan.items.owner if ordinary else plan.dispatch.dst
    return rank_features(plan.items, ranks, plan.dispatch.num_ranks, model)


class OnlineCostFit:
    """Every phase's cost coefficients, fitted online to measured phase times (module doc).

    Deterministic: the same observations in the same order give bit-identical coefficients on
    every rank; :meth:`state_dict` restores a fit exactly on resume.
    """

    def __init__(self, start: CostModel, config: FitConfig | None = None):
        """Args:
        start: the starting model, FLOPs or calibrated seconds (``--cost-calibration``): the
            prior of every fit, and what :meth:`cost_model` returns until the fit is ready.
        config: window, warm-up, robustness, bound and rounding (default :class:`FitConfig`).
        """
        self.start = start
        self.config = config or FitConfig()
        self._fits = {p: OnlineLinearFit(len(FEATURES), self.config, p) for p in start.phase_order}
        self._scales: dict[str, float] = {}

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases fitted, in iteration order."""
        return self.start.phase_order

    def _phase_fit(self, phase: str) -> OnlineLinearFit:
        try:
            return self._fits[phase]
        except KeyError:
            raise ValueError(
                f"cost fit: no phase {phase!r}; the model has {list(self.phases)}"
            ) from None

    def features(self, plan: PhasePlan, *, ordinary: bool = False) -> np.ndarray:
        """:func:`phase_features` of ``plan`` with this fit's model of the phase."""
        return phase_features(plan, self.start[plan.phase], ordinary=ordinary)

    def observe(
        self,
        iteration: int,
        phase: str,
        features: np.ndarray,
        seconds: np.ndarray,
        refit: bool = True,
    ) -> None:
        """Record one phase's measured per-rank times; refit the phase once warm (when
        ``refit``, or when it has no fit yet: a fit costs milliseconds, a record nothing).

        Args:
            iteration: the training iteration (non-decreasing per phase).
            phase: "vision", "audio" or "llm".
            features: (R, 5) what each rank computed (:meth:`features` of the plan it ran).
            seconds: (R,) each rank's measured time of the phase (forward and backward).

        Raises:
            ValueError: an unknown phase, shapes that differ, negative or non-finite values,
                or an iteration older than the last one; the message names the phase.
        """
        fit = self._phase_fit(phase)
        fit.add(iteration, features, seconds)
        if not fit.warm or (not refit and fit.coef is not None):
            return
        x, y = fit.rows()
        if y.size == 0:
            return
        prior = model_coefficients(self.start[phase])
        predicted = x @ prior
        # One scale turns the starting model into seconds (FLOPs -> s, or the calibration's
        # machine -> this run): the median ratio of measured to predicted, robust and cheap.
        # It only sets the prior, which settles what the data cannot tell apart.
        ratios = y[predicted > 0] / predicted[predicted > 0]
        scale = float(np.median(ratios)) if ratios.size else 0.0
        digits = self.config.significant_digits
        self._scales[phase] = float(quantize(np.array([scale]), digits)[0])
        fit.update(quantize(prior * self._scales[phase], digits))

    def warm(self, phase: str) -> bool:
        """Whether ``phase`` has been observed for ``warmup`` iterations."""
        return self._phase_fit(phase).warm

    def scale(self, phase: str) -> float | None:
        """The last fitted scale of the starting model of ``phase`` (seconds per its unit)."""
        return self._scales.get(phase)

    def coefficients(self, phase: str) -> np.ndarray | None:
        """(5,) seconds coefficients of ``phase`` in :data:`COEFFICIENTS` order: the fit, or
        before it a seconds starting model's; None when neither exists yet."""
        coef = self._phase_fit(phase).coef
        if coef is not None:
            return coef.copy()
        if self.start[phase].unit == "seconds":
            return model_coefficients(self.start[phase])
        return None

    def _idle_coefficients(self, phase: str) -> np.ndarray | None:
        """A warm phase no rank ever had work in: its FLOPs prior at the median scale of the
        fitted phases (its costs never matter much, but their unit must match)."""
        scales = sorted(self._scales.values())
        if not self._phase_fit(phase).warm or not scales:
            return None
        scale = scales[len(scales) // 2]
        prior = model_coefficients(self.start[phase]) * scale
        return quantize(prior, self.config.significant_digits)

    def _all_coefficients(self) -> dict[str, np.ndarray] | None:
        out = {}
        for phase in self.phases:
            coef = self.coefficients(phase)
            if coef is None:
                coef = self._idle_coefficients(phase)
            if coef is None:
                return None
            out[phase] = coef
        return out

    @property
    def ready(self) -> bool:
        """Whether every phase is past its warm-up and :meth:`cost_model` is in seconds."""
        return all(self.warm(p) for p in self.phases) and self._all_coefficients() is not None

    def cost_model(self) -> CostModel:
        """The fitted model in seconds, every phase (so units never mix); the starting model
        until every phase has seconds coefficients. Padded phases stay padded."""
        coefs = self._all_coefficients()
        if coefs is None:
            return self.start
        phases = {}
        for phase, coef in coefs.items():
            values = dict(zip(COEFFICIENTS, (float(v) for v in coef)))
            phases[phase] = dataclasses.replace(self.start[phase], unit="seconds", **values)
        return CostModel(phases=phases)

    def describe(self) -> str:
        """``cost fit vision: 0.41 ms/call + 12.1 us/unit + 0.95 us/tok + 0.8 ns/tok^2 | ...``,
        one entry per phase (its warm-up's progress until fitted)."""
        parts = []
        for phase in self.phases:
            fit = self._phase_fit(phase)
            if fit.coef is None:
                seen = min(fit.iterations, self.config.warmup)
                parts.append(f"{phase}: warm-up {seen}/{self.config.warmup}")
                continue
            per = ("call", "sample" if phase == "llm" else "unit", "tok", "tok^2", "out")
            terms = [f"{format_seconds(v)}/{u}" for v, u in zip(fit.coef, per) if v > 0]
            parts.append(f"{phase}: {' + '.join(terms) or '0 s'}")
        return "cost fit " + " | ".join(parts)

    def state_dict(self) -> dict[str, Any]:
        """Plain Python values (picklable) that restore this fit exactly."""
        return {
            "phases": {p: f.state_dict() for p, f in self._fits.items()},
            "scales": dict(self._scales),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values; the starting model and config are this
        object's.

        Raises:
            ValueError: the state's phases differ from the model's, or it is malformed.
        """
        try:
            phases, scales = state["phases"], state["scales"]
            if set(phases) != set(self._fits):
                raise ValueError(f"it has phases {sorted(phases)}, the model {sorted(self._fits)}")
            scales = {str(k): float(v) for k, v in scales.items()}
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"cost fit: cannot restore its state ({e})") from None
        fits = {p: OnlineLinearFit(len(FEATURES), self.config, p) for p in self._fits}
        for phase, fit in fits.items():
            fit.load_state_dict(phases[phase])
        self._fits, self._scales = fits, scales
