# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""One iteration's balance plan as a value: everything it is a function of, and the call.

A post-balancing step plans an iteration from its gathered metadata and its cost model; with
the online cost fit (``--cost-fit``) the model is the fits' after they observed the times that
rode on that iteration's gather. A :class:`PlanJob` holds all of it (the planner, a
module-level function; its keyword arguments; the metadata; the fits and the observation they
have still to make), so the same job gives the same plan wherever it runs: in the step, or in
the rank's planning worker (``orchestration.plan_worker``), a process of its own that shares
neither the step's interpreter lock nor its scheduling priority. The job comes back with the
fits it observed with (:class:`PlanResult`), which the step adopts: every rank feeds the same
values in the same order, whichever way it plans.

Pure numpy, picklable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from orchestration.cost_feedback import CostFeedback, Measured
from orchestration.cost_model import CostModel
from orchestration.metadata import GatheredMetadata


@dataclass
class PlanResult:
    """A job's plan, and the fits it was made with (None without a cost fit)."""

    plan: Any
    """The planner's plan (``IterationPlan``, ``SamplePlan``)."""

    feedback: CostFeedback | None
    """The fits after the job's observation: the step adopts them (the step's own object when
    the job ran in the step)."""


@dataclass
class PlanJob:
    """The plan of one iteration, not yet made (see the module docstring)."""

    planner: Callable[..., Any]
    """A module-level planner, ``planner(metadata, cost_model, **kwargs)``
    (``phase_plan.plan_iteration``, ``sample_plan.plan_whole_samples``)."""

    metadata: GatheredMetadata
    """The iteration's gathered metadata."""

    iteration: int
    """The iteration planned (the fits' exchange model depends on it)."""

    cost_model: CostModel
    """The step's cost model, used as it is without a fit."""

    kwargs: dict[str, Any] = field(default_factory=dict)
    """The planner's keyword arguments (algorithm, caps, ...)."""

    fitted_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments that replace ``kwargs``' once the cost model is fitted (the search
    budget: fitted costs carry constants that weaken the exact search's bound)."""

    feedback: CostFeedback | None = None
    """The online fits (None: no cost fit); the exchange model comes from them too."""

    observation: tuple[Measured | None, list[np.ndarray]] | None = None
    """What the fits observe before the plan (``CostFeedback.observe``'s arguments): the
    previous iteration's times, gathered with this one's metadata; None: nothing."""

    def __call__(self) -> PlanResult:
        fits = self.feedback
        if fits is None:
            return PlanResult(self.planner(self.metadata, self.cost_model, **self.kwargs), None)
        if self.observation is not None:
            fits.observe(*self.observation)
        cost_model, exchange = fits.models(self.iteration)
        kwargs = dict(self.kwargs, exchange=exchange)
        if cost_model is not fits.costs.start:
            kwargs.update(self.fitted_kwargs)
        return PlanResult(self.planner(self.metadata, cost_model, **kwargs), fits)
