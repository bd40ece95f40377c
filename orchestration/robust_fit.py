# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Robust online fits of linear time models: how the planner's costs learn from the timers.

Pure numpy. A time model is linear in its coefficients: one observation row ``x`` (features
of the work a rank did, e.g. its items and tokens in a phase, or the bytes of an all-to-all)
took ``y ~ x . theta`` seconds, with every coefficient ``theta_j >= 0``.
:class:`OnlineLinearFit` keeps the rows of the last ``window`` iterations and, on each update,
fits ``theta`` to them:

* **robustly**: iteratively reweighted least squares with Huber weights (residuals beyond
  ``huber_k`` robust standard deviations, estimated from the median absolute residual, count
  less), so a stalled rank or a descheduled process does not drag the fit;
* **non-negative and ridge-regularised toward a prior** (the starting model's coefficients):
  columns are scaled to unit root mean square first and the ridge is relative to the data's
  own weight, so whatever the units it only settles what the data cannot tell apart (an
  output-token term of a phase that has none stays at its prior; two proportional features
  share their coefficient as the prior does) and biases nothing else. The non-negative problem
  has at most a handful of coefficients, so it is solved exactly by trying every support
  (2**F small solves; the optimum is the feasible unconstrained solution on its own support);
* **with a bounded step**: after the first fit, each coefficient moves at most ``max_step``
  times up or down per update (a coefficient at 0 may grow from the value that would make
  ``zero_share`` of a typical observation), so one odd iteration cannot swing the plans;
* **quantised**: rounded to ``significant_digits`` decimal digits, so that floating-point
  differences far below the timers' noise cannot give one rank another plan.

Every step is deterministic: the same observations, added in the same order, give
bit-identical coefficients; :meth:`OnlineLinearFit.state_dict` holds plain Python values
(floats round-trip exactly), so a resumed run continues as if uninterrupted.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

STATE_VERSION = 1
"""Version of :meth:`OnlineLinearFit.state_dict`'s layout."""

_MAD_TO_SIGMA = 1.4826
"""Median absolute deviation to standard deviation for Gaussian noise."""

_SIGMA_FLOOR = 1e-9
"""Smallest robust scale, relative to the observations' root mean square: a noise-free fit
must not divide by zero."""

_CONVERGED = 1e-8
"""IRLS stops when no normalised coefficient moved more than this (relative): two digits
below the rounding of the result."""


@dataclass(frozen=True)
class FitConfig:
    """How an online time fit weighs, bounds and rounds what it learns."""

    window: int = 64
    """Iterations of observations the fit uses: the most recent ones."""

    warmup: int = 8
    """Observed iterations before the first fit; until then the starting model holds."""

    max_step: float = 2.0
    """After the first fit, each coefficient moves at most this factor up or down per update."""

    ridge: float = 1e-6
    """Weight of the prior (the starting model) relative to the data's (the mean eigenvalue
    of the normalised normal matrix): small, so that the prior decides only what the data
    cannot tell apart (a feature always 0, or proportional to another), not bias the rest."""

    huber_k: float = 1.345
    """Residuals beyond this many robust standard deviations are down-weighted (Huber)."""

    iterations: int = 30
    """Most reweighting iterations per fit."""

    significant_digits: int = 6
    """Fitted coefficients are rounded to this many significant decimal digits."""

    zero_share: float = 0.01
    """A coefficient at or near 0 may grow per update up to ``max_step`` times the value that
    contributes this share of a typical observation's time."""

    def __post_init__(self) -> None:
        for name in ("window", "warmup", "iterations", "significant_digits"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"cost fit: {name} must be an integer >= 1, got {value!r}")
        if self.warmup > self.window:
            raise ValueError(
                f"cost fit: warmup ({self.warmup}) must not exceed window ({self.window})"
            )
        if self.significant_digits > 17:
            raise ValueError(
                f"cost fit: significant_digits must be <= 17, got {self.significant_digits}"
            )
        checks = (
            ("max_step", self.max_step, 1.0, "> 1"),
            ("ridge", self.ridge, 0.0, ">= 0"),
            ("huber_k", self.huber_k, 0.0, "> 0"),
            ("zero_share", self.zero_share, 0.0, "> 0"),
        )
        for name, value, low, what in checks:
            ok = math.isfinite(value) and (value >= low if what == ">= 0" else value > low)
            if not ok:
                raise ValueError(f"cost fit: {name} must be finite and {what}, got {value!r}")


def quantize(values: np.ndarray, digits: int) -> np.ndarray:
    """``values`` rounded to ``digits`` significant decimal digits (float64).

    Python's float formatting rounds correctly, so the result depends on the value only, not
    on the platform.
    """
    return np.array([float(f"{float(v):.{digits}g}") for v in np.ravel(values)], dtype=np.float64)


def nonnegative_ridge(h: np.ndarray, g: np.ndarray, prior: np.ndarray, ridge: float) -> np.ndarray:
    """Exact ``argmin_{phi >= 0} sum w (t - z phi)^2 + lam |phi - prior|^2``.

    Args:
        h: (F, F) the weighted normal matrix ``z' W z``.
        g: (F,) ``z' W t``.
        prior: (F,) what the ridge pulls toward.
        ridge: ``lam`` over the mean eigenvalue of ``h``, so the prior's pull is relative to
            how much the data says, and decides only the directions the data hardly sees
            (features that are always 0, always equal, or proportional).

    Every support ``S`` (the coefficients left free) is tried: the unconstrained minimiser on
    ``S`` is kept when it is non-negative, and the feasible one with the lowest objective wins.
    The optimum is among them (it is the unconstrained minimiser on its own support), so this
    is exact; with at most 5 coefficients it costs one solve when the unconstrained optimum
    is already non-negative, else one batched solve per support size. Ties go to the first
    support in a fixed order, so the answer is deterministic.
    """
    f = g.size
    lam = ridge * float(np.trace(h)) / f
    h = h + lam * np.eye(f)
    g = g + lam * prior
    full = _solve(h, g)
    if full is not None and np.all(full >= 0):
        return full  # the unconstrained optimum is feasible: nothing beats it
    best, best_obj = np.zeros(f), 0.0  # the empty support: phi = 0, objective 0
    for supports in _supports(f):
        hs = h[supports[:, :, None], supports[:, None, :]]
        gs = g[supports]
        try:
            phis = np.linalg.solve(hs, gs[..., None])[..., 0]
        except np.linalg.LinAlgError:  # singular without ridge: solve one by one
            sols = [_solve(a, b) for a, b in zip(hs, gs)]
            phis = np.stack([-np.ones(len(b)) if x is None else x for x, b in zip(sols, gs)])
        # At the minimiser on S, phi'H phi - 2 g'phi = -g_S . phi_S.
        objs = -np.einsum("ij,ij->i", gs, phis)
        feasible = np.all(np.isfinite(phis) & (phis >= 0), axis=1)
        for k in np.flatnonzero(feasible):
            if objs[k] < best_obj:
                best, best_obj = np.zeros(f), float(objs[k])
                best[supports[k]] = phis[k]
    return best


def _solve(h: np.ndarray, g: np.ndarray) -> np.ndarray | None:
    try:
        x = np.linalg.solve(h, g)
    except np.linalg.LinAlgError:
        return None
    return x if np.all(np.isfinite(x)) else None


@functools.cache
def _supports(f: int) -> tuple[np.ndarray, ...]:
    """The proper non-empty subsets of ``range(f)``, grouped by size: (count, size) arrays."""
    return tuple(
        np.array(list(itertools.combinations(range(f), k)), dtype=np.intp) for k in range(1, f)
    )


def robust_fit(x: np.ndarray, y: np.ndarray, prior: np.ndarray, config: FitConfig) -> np.ndarray:
    """Huber-IRLS of ``y ~ x theta`` with ``theta >= 0``, ridge toward ``prior``.

    Args:
        x: (N, F) observation rows.
        y: (N,) seconds of each row.
        prior: (F,) the coefficients the ridge pulls toward.
        config: ``ridge``, ``huber_k`` and ``iterations``.

    Returns:
        (F,) the coefficients (not bounded, not quantised).
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    col = np.sqrt(np.mean(x * x, axis=0))
    col[col == 0] = 1.0  # a column that is always 0 says nothing: its prior stays
    ys = float(np.sqrt(np.mean(y * y))) or 1.0
    z, t = x / col, y / ys
    n, f = z.shape
    phi0 = np.asarray(prior, dtype=np.float64) * col / ys
    # Each row's products z_i z_j once, so that every reweighting forms z' W z with one
    # matrix-vector product instead of touching N x F x F numbers again.
    outer = (z[:, :, None] * z[:, None, :]).reshape(n, f * f)

    def solve(w: np.ndarray) -> np.ndarray:
        h = (w @ outer).reshape(f, f)
        return nonnegative_ridge(h, (w * t) @ z, phi0, config.ridge)

    phi = solve(np.ones(n))
    for _ in range(config.iterations):
        r = np.abs(t - z @ phi)
        sigma = max(_MAD_TO_SIGMA * float(np.median(r)), _SIGMA_FLOOR)
        cut = config.huber_k * sigma
        nxt = solve(np.where(r <= cut, 1.0, cut / np.maximum(r, cut)))
        moved = float(np.max(np.abs(nxt - phi)))
        phi = nxt
        if moved <= _CONVERGED * (1.0 + float(np.max(np.abs(phi)))):
            break
    return phi * ys / col


class OnlineLinearFit:
    """One linear time model fitted online: a window of rows, warm-up, bounded updates.

    Call :meth:`add` with each iteration's rows, then :meth:`update` with the prior; the
    coefficients (``coef``) are None until the first update after ``warmup`` iterations.
    Rows whose features are all 0 (a rank that held no work) carry no information and are
    left out.
    """

    def __init__(self, num_features: int, config: FitConfig, name: str):
        """Args:
        num_features: F, the length of every row.
        config: the fit's settings.
        name: names the model in errors ("vision", "all-to-all").
        """
        self.num_features = int(num_features)
        self.config = config
        self.name = name
        self._obs: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.iterations = 0
        """Distinct iterations observed, over the whole run (warm-up counts these)."""
        self.last_iteration: int | None = None
        self.coef: np.ndarray | None = None
        """(F,) the fitted coefficients, quantised; None before the first fit."""
        self.updates = 0
        """Fits made so far."""

    @property
    def warm(self) -> bool:
        """Whether ``warmup`` iterations have been observed."""
        return self.iterations >= self.config.warmup

    def add(self, iteration: int, x: np.ndarray, y: np.ndarray) -> None:
        """Append one iteration's rows (several calls for one iteration append to it).

        Raises:
            ValueError: wrong shapes, negative or non-finite values, or an iteration older
                than the last one; the message names the model.
        """
        x = np.array(x, dtype=np.float64, ndmin=2)
        y = np.array(y, dtype=np.float64, ndmin=1)
        if x.ndim != 2 or x.shape[1] != self.num_features or y.shape != (x.shape[0],):
            raise ValueError(
                f"{self.name} fit: expected features ({y.size}, {self.num_features}) and "
                f"({x.shape[0]},) seconds, got {x.shape} and {y.shape}"
            )
        for what, a in (("features", x), ("seconds", y)):
            if not np.all(np.isfinite(a)) or np.any(a < 0):
                raise ValueError(
                    f"{self.name} fit: {what} of iteration {iteration} must be finite and "
                    f">= 0, got {a.tolist()}"
                )
        iteration = int(iteration)
        if self.last_iteration is not None and iteration < self.last_iteration:
            raise ValueError(
                f"{self.name} fit: iteration {iteration} observed after iteration "
                f"{self.last_iteration}"
            )
        if iteration != self.last_iteration:
            self.iterations += 1
            self.last_iteration = iteration
        keep = np.any(x != 0, axis=1)
        if keep.any():
            self._obs.append((iteration, x[keep], y[keep]))
        oldest = iteration - self.config.window
        self._obs = [o for o in self._obs if o[0] > oldest]

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        """The informative rows of the window: (N, F) features, (N,) seconds."""
        if not self._obs:
            return np.zeros((0, self.num_features)), np.zeros(0)
        return np.concatenate([o[1] for o in self._obs]), np.concatenate([o[2] for o in self._obs])

    def update(self, prior: np.ndarray) -> np.ndarray | None:
        """Fit the window (ridge toward ``prior``), bound the step, quantise; return ``coef``.

        Without informative rows nothing changes (the coefficients stay as they are).
        """
        x, y = self.rows()
        if y.size == 0:
            return self.coef
        cfg = self.config
        fit = robust_fit(x, y, prior, cfg)
        if self.coef is not None:
            # The value of each coefficient that would explain zero_share of a typical row.
            col = np.sqrt(np.mean(x * x, axis=0))
            typical = float(np.sqrt(np.mean(y * y)))
            floor = np.where(col > 0, cfg.zero_share * typical / np.where(col > 0, col, 1.0), 0)
            high = np.maximum(self.coef, floor) * cfg.max_step
            fit = np.clip(fit, self.coef / cfg.max_step, high)
        self.coef = quantize(fit, cfg.significant_digits)
        self.updates += 1
        return self.coef

    def __getstate__(self) -> dict[str, Any]:
        # The fits travel to the planning worker and back every iteration (plan_job): the
        # window goes as four arrays, not as two small arrays per iteration, whose pickling
        # cost the step's interpreter about 2 ms per iteration at a full window of 64.
        state = dict(self.__dict__)
        obs = state.pop("_obs")
        state["_obs_packed"] = (
            np.array([o[0] for o in obs], dtype=np.int64),
            np.array([o[2].size for o in obs], dtype=np.int64),
            np.concatenate([o[1] for o in obs]) if obs else np.zeros((0, self.num_features)),
            np.concatenate([o[2] for o in obs]) if obs else np.zeros(0),
        )
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        iterations, counts, x, y = state.pop("_obs_packed")
        self.__dict__.update(state)
        ends = np.cumsum(counts).tolist()
        starts = [0, *ends[:-1]]
        self._obs = [(it, x[a:b], y[a:b]) for it, a, b in zip(iterations.tolist(), starts, ends)]

    def state_dict(self) -> dict[str, Any]:
        """Plain Python values (picklable, JSON-able) that restore this fit exactly."""
        return {
            "version": STATE_VERSION,
            "num_features": self.num_features,
            "iterations": self.iterations,
            "last_iteration": self.last_iteration,
            "updates": self.updates,
            "coef": None if self.coef is None else [float(v) for v in self.coef],
            "observations": [[it, x.tolist(), y.tolist()] for it, x, y in self._obs],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (this object's config is kept).

        Raises:
            ValueError: the state is of another version or number of features.
        """
        try:
            version, features = state["version"], state["num_features"]
            if version != STATE_VERSION or features != self.num_features:
                raise ValueError(
                    f"version {version} with {features} features, expected version "
                    f"{STATE_VERSION} with {self.num_features}"
                )
            obs = [
                (int(it), np.array(x, dtype=np.float64).reshape(-1, features),
                 np.array(y, dtype=np.float64))
                for it, x, y in state["observations"]
            ]  # fmt: skip
            coef = state["coef"]
            coef = None if coef is None else np.array(coef, dtype=np.float64).reshape(features)
            last = state["last_iteration"]
            last = None if last is None else int(last)
            counts = int(state["iterations"]), int(state["updates"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{self.name} fit: cannot restore its state ({e})") from None
        self._obs, self.coef, self.last_iteration = obs, coef, last
        self.iterations, self.updates = counts


_SECOND_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns"), (1e-12, "ps"))


def format_seconds(value: float) -> str:
    """``0.41 ms``, ``12.1 us``: three significant digits in the largest unit under ``value``."""
    if value == 0:
        return "0 s"
    for scale, unit in _SECOND_UNITS:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value / 1e-15:.3g} fs"
