# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The trainer's online cost fit, replayed on SEMU's times: the costs a later per-phase plan
is made with.

With ``--cost-fit`` (the default) the per-phase step (``PhaseBalancedStep``) plans with its
starting costs (FLOPs, or ``--cost-calibration``'s seconds) until its fits are warm, then with
coefficients fitted to the phase times its ranks measured, and it weighs each phase's gain
against the exchange time it measured (``orchestration.cost_feedback``). SEMU's per-phase step
of iteration ``i`` replays that: iterations ``0 .. i-1`` are planned as the trainer plans them,
each rank's phase seconds and each exchange's seconds come from SEMU (what the trainer's
timers would measure on the simulated cluster), and they reach the trainer's own fits in the
trainer's order: the times of iteration ``j`` are observed after the plan of ``j + 1`` is taken,
so the plan of ``i`` sees iterations up to ``i - 2``.

Pure numpy, no torch.distributed.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from orchestration.cost_feedback import HOPS, CostFeedback, Measured
from orchestration.cost_model import CostModel
from orchestration.exchange_cost import ExchangeCost
from pipeweaver.ir import Memory
from pipeweaver.semu.post_balance import BalancedBatches, phase_seconds
from pipeweaver.semu.simulator import Semu

PlanOf = Callable[[int, CostModel, "ExchangeCost | None", bool], BalancedBatches]
"""``(iteration, cost model, exchange model or None, fitted) -> the iteration's batches``:
the per-phase plan and microbatches of one iteration
(:func:`pipeweaver.semu.post_balance.phase_balanced_batches`)."""


def replay_cost_fit(
    semu: Semu,
    feedback: CostFeedback,
    plan_of: PlanOf,
    iterations: int,
    memory: Memory = Memory.NONE,
) -> CostFeedback:
    """Feed ``feedback`` (``CostFeedback.starting``, as the trainer makes it) what the trainer's
    fits observe before planning iteration ``iterations``; returns it.

    Args:
        semu: the emulator whose compute and exchange times stand for the measured ones.
        feedback: the fits, as they start.
        plan_of: plans one iteration with the models the fits give for it.
        iterations: the iteration to be planned next (0: nothing is observed).
        memory: the step's memory strategy (the computes' times depend on it).
    """
    previous = None
    for it in range(iterations):
        cost_model, exchange = feedback.models(it)
        batches = plan_of(it, cost_model, exchange, cost_model is not feedback.costs.start)
        if previous is not None:  # the times of it - 1 arrive with it's gather
            feedback.observe(*previous)
        previous = measured_times(semu, feedback, batches, it, memory)
    return feedback


def measured_times(
    semu: Semu, feedback: CostFeedback, batches: BalancedBatches, iteration: int, memory: Memory
) -> tuple[Measured, list[np.ndarray]]:
    """What the trainer's fits observe of one iteration (``CostFeedback.observe``'s arguments):
    the plan's features and exchange bytes, and every rank's control words with SEMU's phase
    seconds and exchange seconds. Every rank is given an exchange's transfer time (SEMU's ranks
    arrive at an exchange as its schedule says, without the host's drift that the trainer's fit,
    taking the mean rank's blocked time, also prices)."""
    ran = {
        hop: (seconds, nbytes)
        for hop, seconds, nbytes in zip(HOPS, batches.exchange_s, batches.exchange_bytes)
        if nbytes > 0  # the step skips an exchange that moves nothing
    }
    hop_s = {h: s for h, (s, _) in ran.items()}
    words = [
        feedback.words_of(Measured(iteration, seconds, hop_s))
        for seconds in phase_seconds(semu, batches, memory)
    ]
    features = {p.phase: feedback.features(p) for p in batches.plan.phases}
    hop_bytes = {h: b for h, (_, b) in ran.items()}
    return Measured(iteration, {}, {}, features, hop_bytes), words
