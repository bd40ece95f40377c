# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The per-phase step's measured times, fed back into its cost model and exchange model.

Each iteration the per-phase step measures, on every rank, each phase's compute (an encoder's
forward and backward, the LLM microbatches) and each of its three exchanges. Those
measurements ride, as int64 nanoseconds, on the next iteration's metadata gather (the control
words of ``BatchLoader.load``), so every rank receives every rank's times without a collective
of its own, and feeds the same values in the same order to the same fits
(``orchestration.cost_fit.OnlineCostFit``, ``orchestration.exchange_cost.ExchangeFit``): every
rank computes identical coefficients, hence identical plans (the digest check verifies it).

Timeline: the plan of iteration ``i`` is made (ahead, during ``i - 1``, or in the step) from the
fits as they were after observing iteration ``i - 2``; iteration ``i - 1``'s times arrive with
``i``'s gather and are observed after ``i``'s plan is taken. Both ways of planning therefore
follow one rule, and :meth:`CostFeedback.state_dict` (the fits and this rank's not yet gathered
times, saved with the rank's checkpoint) lets a resumed run make the plans the uninterrupted run
would have made.

An exchange costs the step what the mean rank spends blocked in it: the transfer, and the wait
for the last rank to arrive. The wait is not all the exchange's doing (an imbalance left before
it would be waited for later anyway), but every synchronisation point the step adds collects the
ranks' drift up to it: on the 2-core CPU host a speech iteration that moved data cost about 5 ms
more than one that kept every phase home, where the shortest rank's duration (the transfer
alone, which the fit took until 2026-12-07) priced its three exchanges at about 1.2 ms.

Pure numpy: the fits travel, with the metadata, to the planning worker
(``orchestration.plan_job``), which observes and plans in a process of its own.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from orchestration.balance import DEFAULT_BUDGET
from orchestration.cost_fit import OnlineCostFit, phase_features
from orchestration.cost_model import CostModel
from orchestration.exchange_cost import ExchangeCost, ExchangeFit, PayloadBytes
from orchestration.robust_fit import FitConfig

HOPS: tuple[str, ...] = ("inputs and tokens", "encoder outputs", "encoder outputs backward")
"""The per-phase step's exchanges, in the order their times travel."""

_NS = 1e9

STARTING_EXCHANGE_LATENCY_S = 2e-4
"""Starting latency of one all-to-all (gloo on one host: 0.1-1 ms); the fit replaces it."""

STARTING_EXCHANGE_SECONDS_PER_BYTE = 1e-9
"""Starting seconds per byte of the busiest rank (1 GB/s); the fit replaces it."""

REWEIGHTING_ITERATIONS = 10
"""Iterations of the robust fit's reweighting (``FitConfig.iterations``)."""

FITTED_BUDGET = dataclasses.replace(DEFAULT_BUDGET, exact_nodes=200)
"""The planner's work limits with fitted costs: the branch and bound searches 200 nodes
(LPT, Karmarkar-Karp and the refinement are unchanged). Fitted costs carry per-call and
per-item constants, which weaken the exact search's bound: with its default node budget a
16-item plan could take 0.2 s of a core."""

REFIT_EVERY = 4
"""Iterations between refits (every iteration's times are recorded): a robust fit of a phase
costs a few milliseconds of a core."""

REMEASURE_EVERY = 64
"""Iterations without a measured exchange after which one plan skips the exchange check (one,
and again every as many while none is measured): once every phase is kept nothing moves, so
without it a network that became cheaper (a quieter host) would never be measured again. Such a
plan balances every phase whatever moving costs, and its iteration pays for it: on the 2-core
CPU host, speech-asr-librispeech, those iterations measured 0.970x Megatron's step (two of them
0.6-0.7x) where the iterations that kept every phase measured 0.985x (2026-12-07). Until then
it was every 16 iterations, and two plans in a row skipped the check (the second was made
before the first one's exchanges were observed)."""


@dataclass
class Measured:
    """What one rank measured in one iteration, and what the plan it ran gave every rank."""

    iteration: int
    """The iteration."""

    phase_s: dict[str, float] = field(default_factory=dict)
    """This rank's compute seconds per phase (forward and backward)."""

    hop_s: dict[str, float] = field(default_factory=dict)
    """This rank's seconds per exchange that ran (waiting included)."""

    features: dict[str, np.ndarray] = field(default_factory=dict)
    """Per phase, every rank's (R, 5) features under the plan (the same on every rank)."""

    hop_bytes: dict[str, float] = field(default_factory=dict)
    """Per exchange that ran, its busiest rank's bytes (the same on every rank)."""


@dataclass
class _Fits:
    """What the fits learnt: the part of :class:`CostFeedback` that observing changes."""

    costs: OnlineCostFit
    exchanges: ExchangeFit
    exchanged_at: int = -1


class CostFeedback:
    """The online fits of one per-phase step (see the module docstring).

    The fits travel to the planning worker with every job and come back with its plan, but the
    step itself only reads them now and then (a log line, a checkpoint, a plan made in the
    step). So they travel sealed: pickled once, by the side that changed them, into one bytes
    object that is carried as it is until someone opens it. On the 2-core CPU main job the
    step's own pickling and unpickling of the open fits, both ways, took about 1 ms of its
    critical path per iteration (2026-12-08); a sealed copy costs a copy of 20 kB. Opening
    gives the same values: a pickle round trip of floats and arrays is exact.
    """

    def __init__(self, start: CostModel, exchange: ExchangeCost, config: FitConfig):
        """Args:
        start: the cost model the fit starts from (FLOPs, or ``--cost-calibration``'s).
        exchange: the exchange model the fit starts from, with the payload sizes of every
            route (the exchange check's).
        config: window, warm-up and robustness of both fits.
        """
        costs = OnlineCostFit(start, config)
        self.start = start
        """The starting cost model (whose phases' shapes the measured features follow)."""
        self._phases = costs.phases
        self._fits: _Fits | None = _Fits(costs, ExchangeFit(exchange, config))
        self._sealed: bytes | None = None
        """The fits pickled, while they are unchanged since (None: not pickled yet)."""
        self.pending: Measured | None = None
        """This rank's latest measurement, not yet gathered."""

    @classmethod
    def starting(
        cls, start: CostModel, payload: PayloadBytes, window: int, warmup: int
    ) -> "CostFeedback":
        """The per-phase step's fits (``--cost-fit``), as they start: from ``start``, the
        starting exchange model with ``payload``'s sizes, over ``--cost-fit-window`` iterations
        after ``--cost-fit-warmup`` (the trainer's, and SEMU's replay of them)."""
        exchange = ExchangeCost(
            STARTING_EXCHANGE_LATENCY_S, STARTING_EXCHANGE_SECONDS_PER_BYTE, payload
        )
        config = FitConfig(window=window, warmup=warmup, iterations=REWEIGHTING_ITERATIONS)
        return cls(start, exchange, config)

    def _read(self) -> _Fits:
        """The fits, opened if sealed (they stay sealed too: reading changes nothing)."""
        if self._fits is None:
            self._fits = pickle.loads(self._sealed)
        return self._fits

    def _write(self) -> _Fits:
        """The fits, about to change: the sealed copy is dropped."""
        fits = self._read()
        self._sealed = None
        return fits

    @property
    def costs(self) -> OnlineCostFit:
        """The phases' cost fit (whoever takes it may change it)."""
        return self._write().costs

    @property
    def exchanges(self) -> ExchangeFit:
        """The exchanges' fit (whoever takes it may change it)."""
        return self._write().exchanges

    @property
    def exchanged_at(self) -> int:
        """The latest iteration whose exchanges were observed (-1: none yet)."""
        return self._read().exchanged_at

    @exchanged_at.setter
    def exchanged_at(self, iteration: int) -> None:
        self._write().exchanged_at = iteration

    @property
    def phases(self) -> tuple[str, ...]:
        return self._phases

    def features(self, plan) -> np.ndarray:
        """A phase plan's (R, 5) measured features (``OnlineCostFit.features``), without
        opening the fits: they follow the starting model's phase shapes only."""
        return phase_features(plan, self.start[plan.phase])

    def models(self, iteration: int) -> tuple[CostModel, ExchangeCost | None]:
        """What the plan of ``iteration`` uses: the cost model, and the exchange model once the
        cost model is fitted (the check compares seconds with seconds), except every
        :data:`REMEASURE_EVERY` iterations without a measured exchange."""
        fits = self._read()
        if not fits.costs.ready:
            return fits.costs.cost_model(), None
        since = iteration - max(fits.exchanged_at, 0)
        if since >= REMEASURE_EVERY and since % REMEASURE_EVERY == 0:
            return fits.costs.cost_model(), None
        return fits.costs.cost_model(), fits.exchanges.cost()

    def words(self) -> np.ndarray:
        """This rank's pending measurement as control words (:meth:`words_of`)."""
        return self.words_of(self.pending)

    def words_of(self, m: Measured | None) -> np.ndarray:
        """A measurement as control words: ``[iteration, phase ns..., hop ns...]`` (a hop that
        did not run is -1); empty for None."""
        if m is None:
            return np.zeros(0, np.int64)
        values = [m.phase_s.get(p, 0.0) for p in self.phases]
        hops = [m.hop_s.get(h, -1.0 / _NS) for h in HOPS]
        return np.array([m.iteration, *(round(v * _NS) for v in values + hops)], np.int64)

    def take_pending(self) -> Measured | None:
        """This rank's pending measurement, which its gathered words are about to be observed
        with (:meth:`observe`); it is no longer pending."""
        m, self.pending = self.pending, None
        return m

    def observe(self, m: Measured | None, gathered: list[np.ndarray]) -> None:
        """Feed every rank's control words of one iteration (:meth:`words`, gathered, in rank
        order) to the fits, with the features and bytes of ``m``, this rank's measurement of
        that iteration (:meth:`take_pending`)."""
        if m is None or not gathered or gathered[0].size == 0:
            return
        if any(int(g[0]) != m.iteration for g in gathered):
            raise ValueError(
                f"measured times of iterations {[int(g[0]) for g in gathered]} gathered, this "
                f"rank measured iteration {m.iteration}"
            )
        fits = self._write()
        table = np.stack([g[1:] for g in gathered]).astype(np.float64) / _NS
        refit = m.iteration % REFIT_EVERY == 0
        for j, phase in enumerate(self.phases):
            if phase in m.features:
                fits.costs.observe(m.iteration, phase, m.features[phase], table[:, j], refit)
        nbytes, seconds = [], []
        for k, hop in enumerate(HOPS):
            column = table[:, len(self.phases) + k]
            if hop in m.hop_bytes and (column >= 0).all():
                nbytes.append(m.hop_bytes[hop])
                seconds.append(float(column.mean()))
        if nbytes:
            fits.exchanges.observe(m.iteration, nbytes, seconds, refit)
            fits.exchanged_at = m.iteration

    def adopt(self, other: "CostFeedback") -> None:
        """Take ``other``'s fits: a copy of these that observed more, in the planning worker
        (this rank's pending measurement stays; adopting itself changes nothing). Sealed fits
        stay sealed."""
        self._fits, self._sealed = other._fits, other._sealed

    def __getstate__(self) -> dict[str, Any]:
        if self._sealed is None:
            self._sealed = pickle.dumps(self._fits, protocol=pickle.HIGHEST_PROTOCOL)
        state = dict(self.__dict__)
        state["_fits"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def describe(self) -> str:
        """The fitted coefficients, for the log line."""
        fits = self._read()
        return f"{fits.costs.describe()} | {fits.exchanges.describe()}"

    def state_dict(self) -> dict[str, Any]:
        """The fits and this rank's pending measurement (plain values, picklable)."""
        m = self.pending
        pending = None
        if m is not None:
            pending = {
                "iteration": m.iteration,
                "phase_s": dict(m.phase_s),
                "hop_s": dict(m.hop_s),
                "features": {p: f.tolist() for p, f in m.features.items()},
                "hop_bytes": dict(m.hop_bytes),
            }
        fits = self._read()
        return {
            "costs": fits.costs.state_dict(),
            "exchanges": fits.exchanges.state_dict(),
            "pending": pending,
            "exchanged_at": fits.exchanged_at,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values.

        Raises:
            ValueError: the state is malformed or of another model.
        """
        fits = self._write()
        fits.costs.load_state_dict(state["costs"])
        fits.exchanges.load_state_dict(state["exchanges"])
        fits.exchanged_at = int(state.get("exchanged_at", -1))
        p = state.get("pending")
        self.pending = None
        if p is not None:
            self.pending = Measured(
                int(p["iteration"]),
                dict(p["phase_s"]),
                dict(p["hop_s"]),
                {k: np.asarray(v, dtype=np.float64) for k, v in p["features"].items()},
                dict(p["hop_bytes"]),
            )
