# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What moving data costs: one exchange's time, and its fit to the measured exchanges.

Pure numpy. One exchange (one :meth:`Dispatcher.move`, direct or node-wise) of a
:class:`~orchestration.routing.Route` takes::

    seconds = latency_s + seconds_per_byte * route_bytes(route, bytes_per_row)

where :func:`route_bytes` is the busiest rank's traffic: the larger of what one rank sends to
the others and what it receives from them, maximised over ranks (an all-to-all ends when its
busiest rank is done). A route that moves nothing costs 0: the step skips its collective
(:attr:`Route.moves_nothing`).

:class:`ExchangeCost` is what the planner reads (``plan_iteration(..., exchange=...)``): the
two coefficients, the payload sizes of every route (:class:`PayloadBytes`) and the margin the
gain of a balanced phase must beat. :class:`ExchangeFit` fits the coefficients online to the
measured exchanges, with the rules of :mod:`orchestration.robust_fit` (window, warm-up,
Huber, non-negative ridge toward the starting values, bounded steps, quantisation), so every
rank that feeds it the same gathered timings holds the same model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from orchestration.robust_fit import FitConfig, OnlineLinearFit, format_seconds
from orchestration.routing import Route


def route_bytes(route: Route, bytes_per_row: float) -> float:
    """Bytes of the busiest rank of one exchange of ``route``: max over ranks of the larger of
    what it sends to others and what it receives from others (rows staying put are free)."""
    moved = route.src != route.dst
    if not moved.any():
        return 0.0
    rows = route.rows[moved].astype(np.float64)
    r = route.num_ranks
    sent = np.bincount(route.src[moved], weights=rows, minlength=r)
    received = np.bincount(route.dst[moved], weights=rows, minlength=r)
    return float(max(sent.max(), received.max())) * float(bytes_per_row)


def busiest_rank_bytes(matrix: np.ndarray) -> float:
    """Bytes of the busiest rank of one exchange given as ``matrix[src, dst]`` bytes: the
    larger of what a rank sends to the others and what it receives from them, maximised over
    ranks (the diagonal stays home). What the exchange fit observes of each exchange."""
    moved = np.array(matrix, dtype=np.float64)
    if not moved.size:
        return 0.0
    np.fill_diagonal(moved, 0.0)
    return float(max(moved.sum(axis=1).max(), moved.sum(axis=0).max()))


@dataclass(frozen=True)
class PayloadBytes:
    """Bytes per row of what each route of a per-phase plan carries."""

    inputs: Mapping[str, float]
    """Per phase: bytes per token of its dispatch (an encoder's pixels or frame features per
    encoder token, the LLM's token ids per LLM token)."""

    outputs: Mapping[str, float] = field(default_factory=dict)
    """Per encoder phase: bytes per encoder token of its outputs on their way to the LLM-phase
    worker (hidden size x element size); their gradients come back the same size."""

    def __post_init__(self) -> None:
        for what, sizes in (("inputs", self.inputs), ("outputs", self.outputs)):
            for phase, value in sizes.items():
                if not math.isfinite(value) or value < 0:
                    raise ValueError(
                        f"payload bytes: {what}[{phase!r}] must be finite and >= 0, got {value!r}"
                    )


@dataclass(frozen=True)
class ExchangeCost:
    """Predicted time of exchanges, as the planner's gain-versus-exchange check reads it."""

    latency_s: float
    """Fixed seconds of one exchange (the collective's latency and the step's packing)."""

    seconds_per_byte: float
    """Seconds per byte of the busiest rank (1 / bandwidth)."""

    payload: PayloadBytes
    """Bytes per row of every route."""

    margin: float = 1.0
    """A phase is balanced only when its predicted gain exceeds ``margin`` x its predicted
    exchange cost (above 1: move only when it clearly pays)."""

    def __post_init__(self) -> None:
        for name in ("latency_s", "seconds_per_byte", "margin"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"exchange cost: {name} must be finite and >= 0, got {value!r}")

    @property
    def bandwidth(self) -> float:
        """Bytes per second (inf when moving bytes is free)."""
        return math.inf if self.seconds_per_byte == 0 else 1.0 / self.seconds_per_byte

    def seconds(self, nbytes: float) -> float:
        """Time of one exchange whose busiest rank moves ``nbytes``."""
        return self.latency_s + self.seconds_per_byte * float(nbytes)

    def route_seconds(self, route: Route, bytes_per_row: float) -> float:
        """Time of one exchange of ``route``: 0 when it moves nothing (skipped)."""
        if route.moves_nothing:
            return 0.0
        return self.seconds(route_bytes(route, bytes_per_row))

    def describe(self) -> str:
        """``all-to-all 210 us + 1.25 GB/s`` for the log line."""
        bw = self.bandwidth
        rate = "free" if math.isinf(bw) else f"{bw / 1e9:.3g} GB/s"
        return f"all-to-all {format_seconds(self.latency_s)} + {rate}"


class ExchangeFit:
    """:class:`ExchangeCost`'s two coefficients fitted online to measured exchanges.

    Usage, every iteration after the exchanges (the same gathered values on every rank)::

        fit = ExchangeFit(ExchangeCost(latency_s=2e-4, seconds_per_byte=1e-9, payload=sizes))
        fit.observe(iteration, [route_bytes(route, row_bytes), ...], [seconds, ...])
        plan = plan_iteration(..., exchange=fit.cost())
    """

    FEATURES = ("exchanges", "bytes")
    """The columns of an observation: 1 per exchange, the busiest rank's bytes."""

    def __init__(self, start: ExchangeCost, config: FitConfig | None = None):
        """Args:
        start: the starting coefficients (the prior of every fit), payload sizes and margin.
        config: window, warm-up, robustness, bound and rounding (default :class:`FitConfig`).
        """
        self.start = start
        self.config = config or FitConfig()
        self._fit = OnlineLinearFit(2, self.config, "all-to-all")

    @property
    def ready(self) -> bool:
        """Whether the coefficients are fitted (warm-up over, some exchange observed)."""
        return self._fit.coef is not None

    def observe(self, iteration: int, nbytes, seconds, refit: bool = True) -> None:
        """Record one iteration's exchanges and refit once the warm-up is over.

        Args:
            iteration: the training iteration (non-decreasing).
            nbytes: per exchange that ran, :func:`route_bytes` of its route (scalar or list).
            seconds: per exchange, what it cost the step: the seconds the mean rank spent
                blocked in it, the transfer and the wait for the last rank to arrive
                (``orchestration.cost_feedback``).

        Raises:
            ValueError: shapes differ, or a value is negative or not finite.
        """
        b = np.array(nbytes, dtype=np.float64, ndmin=1)
        s = np.array(seconds, dtype=np.float64, ndmin=1)
        if b.shape != s.shape or b.ndim != 1:
            raise ValueError(f"all-to-all fit: {b.size} byte counts for {s.size} exchange times")
        self._fit.add(iteration, np.stack([np.ones_like(b), b], axis=1), s)
        if self._fit.warm and (refit or self._fit.coef is None):
            self._fit.update(np.array([self.start.latency_s, self.start.seconds_per_byte]))

    def cost(self) -> ExchangeCost:
        """The fitted model (the starting one before the warm-up is over)."""
        coef = self._fit.coef
        if coef is None:
            return self.start
        return dataclasses.replace(
            self.start, latency_s=float(coef[0]), seconds_per_byte=float(coef[1])
        )

    def describe(self) -> str:
        """``exchange fit: all-to-all 210 us + 1.25 GB/s`` (or the warm-up's progress)."""
        if not self.ready:
            return (
                f"exchange fit: warm-up {min(self._fit.iterations, self.config.warmup)}/"
                f"{self.config.warmup}"
            )
        return f"exchange fit: {self.cost().describe()}"

    def state_dict(self) -> dict[str, Any]:
        """Plain Python values that restore this fit exactly (:meth:`load_state_dict`)."""
        return {"fit": self._fit.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values; the starting model and config are this
        object's.

        Raises:
            ValueError: the state is malformed.
        """
        if not isinstance(state, Mapping) or "fit" not in state:
            raise ValueError("all-to-all fit: cannot restore its state (no 'fit' entry)")
        self._fit.load_state_dict(state["fit"])
