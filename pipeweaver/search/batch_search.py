# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""One batch's schedule search, as the trainer runs it: phases 1-3 on the run's SEMU.

:class:`BatchSearch` is the searcher of ``--pipeline-schedule dynamic`` (the trainer builds it
from its flags in ``megatron.mllm.steps.schedule_ahead.trainer_search``): MCTS over segment
priorities (:mod:`pipeweaver.search.mcts`), each rollout ordered by phase 2 and scored by SEMU;
under a memory limit phase 2 keeps every order within it as if every pair were recomputed, so
that phase 3 (:mod:`pipeweaver.search.memory_plan`) can always fit it, and phase 3 runs once, on
the best order (one ILP per rollout would leave the search a few rollouts). The order the run
has without the search (greedy on FLOP durations, within the limit) is scored too, and the
faster of the two by SEMU is returned: the search is never predicted to lose to greedy.

Pure Python/numpy, no torch: the trainer runs it in a process of its own
(:class:`SearchInWorker`), which imports this module and what it needs, never the trainer.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from orchestration.model_shape import ModelShape
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.ir import Memory
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.semu.batches import MicrobatchMeta
from pipeweaver.semu.simulator import Semu


@dataclass(frozen=True, slots=True)
class SearchOutcome:
    """What one search produced."""

    schedule: Schedule
    """The schedule (lowered; its computes carry their memory strategies)."""

    rollouts: int
    """Rollouts the search ran."""

    predicted_s: float
    """SEMU's step time of :attr:`schedule`."""

    greedy_s: float
    """SEMU's step time of the greedy order on the same batch."""

    search_s: float
    """Seconds the search took (for :class:`SearchInWorker`, the round trip to its worker)."""


@dataclass
class BatchSearch:
    """The searcher of one run (see the module docstring); call it with ``(placement,
    structure, microbatches)`` for a :class:`SearchOutcome`."""

    semu: Semu
    """SEMU of the run's model, cluster and calibration: scores the search's candidates."""

    fallback_semu: Semu
    """A second SEMU of the same, for :meth:`fallback`, which runs in the step while a search
    may run in the background: the two never share caches."""

    shape: ModelShape
    """The model's shape (greedy's FLOP durations)."""

    rollouts: int
    """Rollouts per batch (``--schedule-search-rollouts``; with the seed, fixes the result)."""

    budget_ms: float
    """The time one batch's search may take (``--schedule-search-budget-ms``)."""

    seed: int
    """The search's seed (the run's ``--seed``)."""

    workers: int = 1
    """Processes scoring each wave of the search (``--schedule-search-workers``)."""

    timeout_s: float = 120.0
    """Bound of every wait on the scoring processes."""

    memory: Memory = Memory.NONE
    """Every pair's memory strategy without a limit (``--pipeline-recompute all``: recompute)."""

    limit_gb: float | None = None
    """``--pipeline-memory-limit-gb`` (None: the device's memory, if any)."""

    device_bytes: float | None = None
    """The device's memory (None on a CPU: no limit without the flag)."""

    _pool: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict:
        # A pool's processes belong to the process that started them.
        state = {k: getattr(self, k) for k in self.__dataclass_fields__}
        state["_pool"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    @property
    def unlimited(self) -> bool:
        """Whether no memory limit applies (no flag, no GPU): greedy then needs no ILP."""
        return self.limit_gb is None and self.device_bytes is None

    def limits(self, placement: Placement) -> list[float | None] | None:
        """Per stage, the activation bytes allowed (None: no limit)."""
        from pipeweaver.search.memory_limit import memory_limit_bytes

        limits = memory_limit_bytes(
            self.device_bytes, self.semu.static_bytes(placement), self.limit_gb
        )
        return limits if any(x is not None for x in limits) else None

    def _limited(self, semu, placement, microbatches, limits) -> dict:
        """Phase 2's options under ``limits``: every order fits with every pair recomputed."""
        return {
            "memory_limit": limits,
            "activation_bytes": semu.activation_bytes(placement, microbatches, Memory.RECOMPUTE),
        }

    def _fit(self, semu, schedule: Schedule, placement, microbatches, limits) -> Schedule:
        """Phase 3: the memory strategy of every pair of ``schedule``'s order."""
        from pipeweaver.search.memory_plan import StrategyCosts, plan_memory

        costs = StrategyCosts.from_semu(semu, placement, microbatches)
        return plan_memory(schedule, costs, limits).schedule

    def _time(self, schedule: Schedule, microbatches) -> float:
        return self.semu.simulate_pipeline(schedule, microbatches, record_events=False).makespan

    def __call__(self, placement: Placement, structure: MicrobatchStructure,
                 microbatches: Sequence[MicrobatchMeta]) -> SearchOutcome:  # fmt: skip
        from pipeweaver.search.mcts import OrderEvaluator, search_schedule

        start = time.perf_counter()
        limits = self.limits(placement)
        options = {"memory": self.memory}
        if limits is not None:
            options.update(self._limited(self.semu, placement, microbatches, limits))
        evaluator = OrderEvaluator(placement, structure, microbatches, self.semu, **options)
        if self.workers > 1 and self._pool is None:
            from pipeweaver.search.search_pool import SearchPool

            self._pool = SearchPool(self.workers, timeout_s=self.timeout_s)
        result = search_schedule(
            placement, structure, microbatches, None, rollouts=self.rollouts, seed=self.seed,
            budget_ms=self.budget_ms, evaluator=evaluator, workers=self.workers,
            pool=self._pool,
        )  # fmt: skip
        best = result.schedule
        if limits is not None:
            best = self._fit(self.semu, best, placement, microbatches, limits)
        # The order the run would have without the search (FLOP durations) is a candidate
        # too: the search starts from phase 2 on SEMU's durations, which SEMU may predict
        # slower, and the step must never be predicted slower than without the search.
        greedy = self._greedy(self.semu, placement, structure, microbatches)
        best_s, greedy_s = self._time(best, microbatches), self._time(greedy, microbatches)
        if greedy_s <= best_s:
            best, best_s = greedy, greedy_s
        return SearchOutcome(best, result.rollouts, best_s, greedy_s,
                             time.perf_counter() - start)  # fmt: skip

    def greedy_outcome(self, placement: Placement, structure: MicrobatchStructure,
                       microbatches: Sequence[MicrobatchMeta]) -> SearchOutcome:  # fmt: skip
        """The greedy order and SEMU's time of it, searched nothing: what a batch the search
        guard keeps off the search runs (its time is the guard's yardstick)."""
        start = time.perf_counter()
        schedule = self._greedy(self.semu, placement, structure, microbatches)
        greedy_s = self._time(schedule, microbatches)
        return SearchOutcome(schedule, 0, greedy_s, greedy_s, time.perf_counter() - start)

    def close(self) -> None:
        """Stop the search's scoring processes (a later search starts them again)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def fallback(self, placement: Placement, structure: MicrobatchStructure,
                 microbatches: Sequence[MicrobatchMeta]) -> Schedule:  # fmt: skip
        """The greedy order (FLOP durations, as without the search), within the memory limit
        when there is one; what a step whose search missed its deadline runs."""
        return self._greedy(self.fallback_semu, placement, structure, microbatches)

    def _greedy(self, semu, placement, structure, microbatches) -> Schedule:
        from pipeweaver.interleave import flops_durations, greedy_dual_queue

        limits = self.limits(placement)
        options = {} if limits is None else self._limited(semu, placement, microbatches, limits)
        durations = flops_durations(self.shape, placement, microbatches)
        schedule = greedy_dual_queue(placement, structure, durations, memory=self.memory,
                                     **options)  # fmt: skip
        if limits is None:
            return schedule
        return self._fit(semu, schedule, placement, microbatches, limits)


SEARCH_NICENESS = 19
"""The search worker's niceness: the lowest priority. A search that is late costs nothing (the
step runs greedy's order and says so), while CPU it takes from a computing rank delays the
step; at the lowest priority it runs on cores the ranks leave idle (their waits), and where a
host has a core to spare, as a GPU host does, at full speed."""

_RESIDENT: dict[int, BatchSearch] = {}
"""In a search worker: the searchers it holds, by their key (one per worker in the trainer).
They stay between batches, so SEMU's caches serve every later batch (DIP's temporal reuse)."""


@dataclass
class _ResidentCall:
    """A job for the search worker (:class:`orchestration.plan_worker.PlanWorker`): call a
    method of the searcher it holds, installing the searcher first when it travels along."""

    key: int
    method: str
    args: tuple
    searcher: BatchSearch | None = None

    def __call__(self) -> Any:
        if self.searcher is not None:
            _RESIDENT[self.key] = self.searcher
        if self.method == "close":
            _RESIDENT.pop(self.key).close()
            return None
        return getattr(_RESIDENT[self.key], self.method)(*self.args)


class SearchInWorker:
    """A :class:`BatchSearch` run in a process of its own: the searcher travels to the worker
    once, at the first batch, and stays there; each batch then sends its placement, structure
    and microbatches and waits for the outcome, blocked on a pipe (without the interpreter
    lock).

    Why a process: a search in a thread of the training process shares its interpreter lock,
    so each time the step releases it around a kernel the search may take it, and the step
    waits for it back before it can launch the next one (the same reason the balance plan is
    made in ``orchestration.plan_worker``). DIP's planner, too, works one batch ahead on idle CPU
    cores (docs/architecture.md [2]).
    The worker is the planner's (:class:`~orchestration.plan_worker.PlanWorker`): a fresh
    interpreter without torch, bounded waits, a death reported naming the rank.
    """

    def __init__(self, search: BatchSearch, name: str, timeout_s: float):
        """Args:
        search: the searcher; a copy of it goes to the worker, which searches (this
            process keeps ``search`` for greedy's fallback and SEMU's time of greedy).
        name: who the worker searches for, as errors name it (e.g. ``rank 0``).
        timeout_s: the longest one search may take before it is an error.
        """
        self.search = search
        self.name = name
        self.timeout_s = timeout_s
        self._worker = None

    @property
    def budget_ms(self) -> float:
        return self.search.budget_ms

    @property
    def workers(self) -> int:
        return self.search.workers

    @property
    def pid(self) -> int | None:
        """The worker's process id (None before the first search)."""
        return None if self._worker is None else self._worker.process.pid

    def __call__(self, placement: Placement, structure: MicrobatchStructure,
                 microbatches: Sequence[MicrobatchMeta]) -> SearchOutcome:  # fmt: skip
        from orchestration.plan_worker import PlanWorker

        start = time.perf_counter()
        searcher = None
        if self._worker is None:
            self._worker = PlanWorker(self.name, role="search worker", niceness=SEARCH_NICENESS,
                                      hint="--schedule-search-budget-ms 0 runs greedy")  # fmt: skip
            searcher = self.search
        job = _ResidentCall(id(self), "__call__", (placement, structure, list(microbatches)),
                            searcher)  # fmt: skip
        outcome, _ = self._worker.submit(job).result(self.timeout_s)
        return dataclasses.replace(outcome, search_s=time.perf_counter() - start)

    def close(self) -> None:
        """Stop the worker (and the scoring processes it started); idempotent."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        try:
            worker.submit(_ResidentCall(id(self), "close", ())).result(min(self.timeout_s, 10.0))
        except Exception:  # a worker that died or hangs is stopped below all the same
            pass
        worker.close()
