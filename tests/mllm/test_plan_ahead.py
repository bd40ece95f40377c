# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Planning ahead in the rank's planning worker: plans made ahead are the ones taken, made in a
child process; a plan not submitted is made in the step; a planner's error reaches the step; a plan past the timeout is one error naming the iteration; a worker
that died is one error naming the rank; the fits a job observed with come back with its plan."""

from __future__ import annotations

import functools
import operator
import os
import time

import numpy as np
import pytest

from megatron.mllm.steps.plan_ahead import PlanAhead
from orchestration.balance import InfeasibleCapError
from orchestration.cost_feedback import CostFeedback, Measured
from orchestration.cost_model import CostModel
from orchestration.exchange_cost import ExchangeCost, PayloadBytes
from orchestration.metadata import GatheredMetadata, PlanError
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.packing import microbatch_indices
from orchestration.phase_plan import plan_iteration
from orchestration.plan_job import PlanJob
from orchestration.robust_fit import FitConfig
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec


def test_a_plan_made_ahead_is_taken_and_one_not_submitted_is_made_in_the_step():
    ahead = PlanAhead(enabled=True, timeout_s=30, name="rank 0")
    try:
        ahead.submit(5, functools.partial(os.getpid))
        made_in, was_ahead = ahead.take(5, lambda: "in step")
        assert was_ahead and made_in != os.getpid()
        ahead.submit(6, functools.partial(os.getppid))
        assert ahead.take(6, lambda: None) == (os.getpid(), True)
        assert ahead.take(7, lambda: "plan 7 in step") == ("plan 7 in step", False)
        assert ahead.background_s == 0.0
        # A plan submitted for another iteration is not taken for this one.
        ahead.submit(9, functools.partial(max, [3, 9]))
        assert ahead.take(8, lambda: "plan 8") == ("plan 8", False)
        # An answer left in the pipe by a dropped job is never taken for a later one.
        ahead.submit(10, functools.partial(max, [3, 10]))
        assert ahead.take(10, lambda: None) == (10, True)
    finally:
        ahead.close()


def test_a_planner_error_is_raised_in_the_step_and_a_late_plan_names_its_iteration():
    ahead = PlanAhead(enabled=True, timeout_s=0.5)
    try:
        ahead.submit(3, functools.partial(operator.truediv, 1, 0))
        with pytest.raises(ZeroDivisionError):
            ahead.take(3, lambda: None)
        ahead.submit(4, functools.partial(time.sleep, 5))
        with pytest.raises(PlanError, match="iteration 4, computed ahead, did not finish"):
            ahead.take(4, lambda: None)
    finally:
        ahead.close()


def test_a_dead_worker_is_one_error_naming_the_rank():
    ahead = PlanAhead(enabled=True, timeout_s=30, name="rank 1")
    try:
        ahead.submit(1, functools.partial(os._exit, 3))
        with pytest.raises(PlanError, match=r"planning worker of rank 1 .* died \(exit status 3\)"):
            ahead.take(1, lambda: None)
    finally:
        ahead.close()


def _shape() -> ModelShape:
    enc = lambda d: TransformerShape(  # noqa: E731
        2, 64, 256, 4, input_flops_per_token=2.0 * d * 64, output_flops_per_token=2.0 * 64 * 64
    )
    llm = TransformerShape(4, 64, 256, 4, causal=True, output_flops_per_token=2.0 * 64 * 512)
    return ModelShape(llm=llm, encoders={"vision": enc(48), "audio": enc(32)})


GEN = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=1, token_scale=0.05)


def _metadata(iteration: int) -> GatheredMetadata:
    """Two ranks' samples of one iteration, four each, as Megatron's sampler deals them."""
    ranks = [
        [(k, GEN.sample(k)) for mb in microbatch_indices(iteration, r, 2, 2, 2) for k in mb]
        for r in range(2)
    ]
    return GatheredMetadata.from_rank_samples(ranks)


def _feedback() -> CostFeedback:
    payload = PayloadBytes(inputs={"vision": 4.0, "audio": 4.0, "llm": 8.0},
                           outputs={"vision": 4.0, "audio": 4.0})  # fmt: skip
    return CostFeedback(CostModel.build(_shape()), ExchangeCost(2e-4, 1e-9, payload),
                        FitConfig(window=8, warmup=2, iterations=5))  # fmt: skip


def _job(feedback: CostFeedback, iteration: int, observation=None, caps=None) -> PlanJob:
    kwargs = dict(algorithm="auto", caps=caps or {}, gpus_per_node=2, min_llm_samples=2)
    return PlanJob(plan_iteration, _metadata(iteration), iteration, feedback.costs.start,
                   kwargs, {}, feedback, observation)  # fmt: skip


def test_the_worker_plans_and_fits_as_the_step_would():
    """Two fits fed the same measured times, one in this process and one in the worker (its
    fits adopted back after every job), make the same plans and end with the same
    coefficients, once the costs are fitted."""
    here, there = _feedback(), _feedback()
    ahead = PlanAhead(enabled=True, timeout_s=60, name="rank 0")
    rng = np.random.default_rng(0)
    observation = None
    try:
        for it in range(12):
            # This process observes, then plans; the worker gets the same observation.
            mine = _job(here, it, observation)()
            ahead.submit(it, _job(there, it, observation))
            theirs, was_ahead = ahead.take(it, lambda: None)
            assert was_ahead and theirs.plan.digest == mine.plan.digest
            there.adopt(theirs.feedback)
            # This iteration's times, observed with the next plan.
            features = {p.phase: here.costs.features(p) for p in mine.plan.phases}
            phase_s = {p: float(rng.uniform(0.01, 0.05)) for p in here.phases}
            gathered = [
                np.array([it, *(round(phase_s[p] * 1e9) + 1000 * r for p in here.phases),
                          -1, -1, -1], np.int64)
                for r in range(2)
            ]  # fmt: skip
            observation = (Measured(it, phase_s, {}, features, {}), gathered)
        assert here.costs.ready
        assert here.describe() == there.describe()
    finally:
        ahead.close()


def test_a_cap_error_in_the_worker_is_the_planner_error_with_its_fields():
    ahead = PlanAhead(enabled=True, timeout_s=60)
    try:
        ahead.submit(1, _job(_feedback(), 1, caps={"llm": 10}))
        with pytest.raises(InfeasibleCapError) as e:
            ahead.take(1, lambda: None)
        assert e.value.phase == "llm"
    finally:
        ahead.close()
