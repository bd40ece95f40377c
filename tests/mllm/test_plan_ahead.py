# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The plan-ahead thread: plans made ahead are the ones taken, a plan not submitted is made in
the step, a planner's error reaches the step, a plan past the timeout is one error naming the
iteration."""

from __future__ import annotations

import threading

import pytest

from megatron.mllm.steps.plan_ahead import PlanAhead
from orchestration.metadata import PlanError


def test_a_plan_made_ahead_is_taken_and_one_not_submitted_is_made_in_the_step():
    ahead = PlanAhead(enabled=True, timeout_s=30)
    try:
        made_in = []
        ahead.submit(5, lambda: made_in.append(threading.get_ident()) or "plan 5")
        assert ahead.take(5, lambda: "in step") == ("plan 5", True)
        assert made_in and made_in[0] != threading.get_ident()
        assert ahead.take(6, lambda: "plan 6 in step") == ("plan 6 in step", False)
        assert ahead.background_s == 0.0
        # A plan submitted for another iteration is not taken for this one.
        ahead.submit(8, lambda: "plan 8")
        assert ahead.take(7, lambda: "plan 7") == ("plan 7", False)
    finally:
        ahead.close()


def test_a_planner_error_is_raised_in_the_step_and_a_late_plan_names_its_iteration():
    ahead = PlanAhead(enabled=True, timeout_s=0.2)
    try:
        ahead.submit(3, lambda: (_ for _ in ()).throw(PlanError("cap too small")))
        with pytest.raises(PlanError, match="cap too small"):
            ahead.take(3, lambda: None)
        release = threading.Event()
        ahead.submit(4, lambda: release.wait(10))
        with pytest.raises(PlanError, match="iteration 4, computed ahead, did not finish"):
            ahead.take(4, lambda: None)
        release.set()
    finally:
        ahead.close()
