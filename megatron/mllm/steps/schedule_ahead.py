# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The dynamic pipeline's searched schedule, found one batch ahead and shared by the pipeline.

``--pipeline-schedule dynamic`` with a search budget (``--schedule-search-budget-ms``) orders
every batch with the hierarchical search (:mod:`pipeweaver.search`) instead of the greedy
dual-queue rule alone. Who searches, and when:

* **one planner per pipeline.** The first stage of each pipeline searches and sends the
  result to the other stages with one broadcast of a fixed-size int64 vector (the compute order
  of every stage, the memory strategy of every compute, and what the search found). The other
  stages lower the same order with the same deterministic lowering, so every stage executes
  the same schedule. A search on every stage would need no message, but it would spend every
  stage's host time on the same work, and a deadline (below) would need a message anyway for
  the stages to agree on whether it was met.
* **one batch ahead.** Megatron's data order is known ahead: the loader hands the step the next
  iteration's samples (``GlobalBatch.next_microbatches``), and the planner starts the next
  search as soon as this iteration's schedule is out. A background thread packs the samples
  and hands them to the search's own process
  (:class:`~pipeweaver.search.batch_search.SearchInWorker`), where the pure Python/numpy search
  runs without the step's interpreter lock; the thread waits on a pipe. The search needs no
  process group.
* **a deadline.** When the step needs its schedule and the search made ahead has not finished,
  the step does not wait: it runs the greedy order, and the log line says so (``greedy
  (search missed its deadline)``). Without a search made ahead (the first iteration, a resume,
  a balancing step that forms microbatches only after its exchange) the step searches in place
  within the same budget, and the time shows as ``schedule`` in the timers.

Determinism: the search's seed is fixed by the run and its rollout budget by
``--schedule-search-rollouts``, so the same batch gets the same schedule in every run when the
time budget is not reached first; a resumed run therefore executes the schedules of the
uninterrupted one. ``--schedule-search-workers N`` scores each wave of N expansions in N
processes: the schedule depends on N, never on the processes' timing.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from megatron.mllm import distributed
from megatron.mllm.steps.schedule_wire import (
    LOCAL_UNTIL_WORD,
    SOURCES,
    ScheduleRecord,
    decode,
    encode,
    words_length,
)
from orchestration.measured_guard import AlternatingArms, MeasuredGuard
from orchestration.metadata import PlanError
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.ir import Memory, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.search.batch_search import BatchSearch, SearchOutcome
from pipeweaver.semu.batches import MicrobatchMeta, SubBatch

SearchFn = Callable[[Placement, MicrobatchStructure, Sequence[MicrobatchMeta]], SearchOutcome]
"""``(placement, structure, microbatches) -> SearchOutcome``: the searcher, bound to the run's
SEMU, seed and budgets."""


def semu_microbatch(mb) -> MicrobatchMeta:
    """SEMU's view of a runtime microbatch (``megatron.mllm.pipeline.PipelineMicrobatch``):
    the LLM's packed sequences and each encoder sub's units and rows, unpadded."""
    lens = tuple(int(n) for n in mb.language.seq_lens)
    encoders = {}
    for encoder in mb.subs:
        encoders[encoder] = tuple(
            SubBatch(tuple(int(u) for u in sub.unit_lens), int(sub.num_rows))
            for sub in mb.subs[encoder]
        )
    return MicrobatchMeta(lens, sum(lens), encoders, 0.0, 0)


def _shape(mb: MicrobatchMeta) -> tuple:
    """What a schedule depends on: the sequences and the subs (not the FLOPs or the count of
    samples, which only the loader's packing knows)."""
    return mb.llm_seq_lens, tuple(sorted(mb.encoders.items()))


class SearchedSchedules:
    """The runtime's ``schedule_fn`` for a searched dynamic pipeline (see the module docstring).

    Call :meth:`prepare` before each step with the next iteration's microbatches (this rank's,
    from the loader), then let the runtime call the object for the step's schedule.
    """

    def __init__(self, search: SearchFn, greedy: Callable[..., Schedule], pp_group,
                 device: torch.device, ahead: bool, timeout_s: float,
                 next_microbatches: Callable[[list], Sequence[MicrobatchMeta]],
                 guard: MeasuredGuard | AlternatingArms | None = None,
                 greedy_outcome: SearchFn | None = None,
                 local_greedy: bool = False):  # fmt: skip
        """Args:
        search: the searcher (:data:`SearchFn`).
        greedy: the greedy schedule function ``(placement, structure, microbatches)``.
        pp_group: this pipeline's process group (the broadcast's).
        device: where the broadcast vector lives (CUDA with NCCL).
        ahead: search the next batch in the background (False: every search in the step).
        timeout_s: the longest the background thread may take to stop at the run's end.
        next_microbatches: this rank's next-iteration samples (lists of ``SampleMeta`` per
            microbatch) -> SEMU's microbatches, packed exactly as the runtime packs them.
        guard: holds the search against the measured step time (the first stage's; None:
            the search runs on every batch).
        greedy_outcome: with a guard, the greedy order with SEMU's time of it, what a batch
            the guard keeps off the search gets (a :data:`SearchFn` that does not search).
        local_greedy: with a guard, whether every stage may run ``greedy`` by itself between
            the guard's probes (it must then give every stage the same schedule: not where a
            memory limit's ILP with a time limit runs in it; the planner then keeps sending
            greedy's schedule).
        """
        if guard is not None and greedy_outcome is None:
            raise ValueError("a search guard needs greedy_outcome")
        self.search = search
        self.guard = guard
        self.greedy_outcome = greedy_outcome
        self.local_greedy = local_greedy
        self._iteration = 0  # this planner's steps so far: the guard's clock
        self._local_until = 0  # steps before this one order their batches on every stage
        self._step_started: float | None = None
        self.greedy = greedy
        self.pp_group = pp_group
        self.device = device
        self.timeout_s = timeout_s
        self.to_semu = next_microbatches
        self.stage = dist.get_rank(pp_group)
        self.ahead_requested = ahead
        """Whether the run searches ahead (the loader then looks ahead on every stage)."""
        self.ahead = ahead and self.stage == 0
        self._executor = None
        if self.ahead:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="orchweave-schedule-search"
            )
        # The SEMU instance behind ``search`` keeps caches: one search at a time.
        self._lock = threading.Lock()
        self._next: list | Callable[[], list] | None = None
        self._pending: concurrent.futures.Future | None = None
        self.last: ScheduleRecord | None = None
        """What the latest step's schedule was."""
        self.limit_note = ""
        """Names the memory limit's flag in a planner's error (`` (--pipeline-memory-limit-gb
        X)``), when the run sets it."""

    def prepare(self, next_samples: list | Callable[[], list] | None) -> None:
        """The next iteration's samples of this rank, per microbatch (None at the run's end),
        or a function that waits for them; the search for them starts once this step's
        schedule is out."""
        self._next = next_samples

    def __call__(self, placement: Placement, structure: MicrobatchStructure,
                 microbatches: Sequence) -> Schedule:  # fmt: skip
        if self._iteration < self._local_until:
            return self._local_greedy(placement, structure, microbatches)
        n = words_length(placement, structure)
        failure = None
        if self.stage == 0:
            self._measure()
            try:
                words = self._plan(placement, structure, [semu_microbatch(m) for m in microbatches])
            except ScheduleError as e:  # e.g. a batch that cannot fit the memory limit
                failure = str(e)
                words = np.full(n, -1, dtype=np.int64)
            buf = torch.from_numpy(words).to(self.device)
        else:
            buf = torch.zeros(n, dtype=torch.int64, device=self.device)
        if buf.numel() != n:
            raise ScheduleError(f"the planner sent {buf.numel()} words, this stage expects {n}")
        distributed.broadcast_from_first(buf, self.pp_group)
        if int(buf[0]) < 0:
            # Every stage stops with the planner's reason, not only the planner.
            message = distributed.broadcast_object_from_first(failure, self.pp_group)
            raise PlanError(f"the pipeline schedule of this batch{self.limit_note}: {message}")
        schedule, self.last = decode(buf.cpu().numpy(), placement, structure)
        self._local_until = int(buf[LOCAL_UNTIL_WORD])
        self._submit_next(placement)
        self._iteration += 1
        return schedule

    def _local_greedy(self, placement, structure, microbatches) -> Schedule:
        """A step in a window the guard keeps off the search: every stage knows the window
        from the last broadcast and orders its batch greedily itself, as a run without the
        search does; no message, nothing searched."""
        if self.stage == 0:
            self._measure()
        mbs = [semu_microbatch(m) for m in microbatches]
        schedule = self.greedy(placement, structure, mbs)
        gain = self.last.guard_gain if self.last is not None else 0.0
        self.last = ScheduleRecord("guard", 0, 0.0, 0.0, 0.0, guard_gain=gain)
        self._submit_next(placement)  # the window's last step plans the probe's first batch
        self._iteration += 1
        return schedule

    def _measure(self) -> None:
        """The previous step's measured time (from its schedule to this one's), to the guard."""
        now = time.perf_counter()
        if self.guard is not None and self._step_started is not None and self.last is not None:
            self.guard.record(self._iteration - 1, now - self._step_started, self.last.greedy_s)
        self._step_started = now

    def _searching(self) -> bool:
        return self.guard is None or self.guard.enabled(self._iteration)

    def _planner_for(self, iteration: int, searched: bool) -> SearchFn:
        """What plans batch ``iteration``: the search; else greedy with SEMU's time of it where
        the guard's probe will weigh that iteration; else greedy alone."""
        if searched:
            return self.search
        return self.greedy_outcome if self.guard.probing(iteration) else self._greedy_only

    def _greedy_only(self, placement, structure, mbs) -> SearchOutcome:
        """Greedy's schedule, without SEMU's time of it (no probe weighs it)."""
        start = time.perf_counter()
        schedule = self.greedy(placement, structure, mbs)
        return SearchOutcome(schedule, 0, 0.0, 0.0, time.perf_counter() - start)

    def _encode(self, outcome: SearchOutcome, source: str) -> np.ndarray:
        """The schedule's vector; after a probe that turned the search off, it also tells
        every stage to order the batches up to the next probe itself."""
        gain, local_until = None, 0
        if self.guard is not None:
            gain = self.guard.gain
            decided_off = gain is not None and not self.guard.on
            local = self.local_greedy and decided_off
            if local and not self.guard.probing(self._iteration + 1):
                local_until = self.guard.next_probe
        return encode(outcome.schedule, SOURCES.index(source), outcome, gain, local_until)

    def _plan(self, placement, structure, mbs: list[MicrobatchMeta]) -> np.ndarray:
        """The first stage's schedule of this step, encoded."""
        future, self._pending = self._pending, None
        if future is not None:
            if not future.done():
                waited = time.perf_counter() - future.started
                schedule = self.greedy(placement, structure, mbs)
                return encode(schedule, SOURCES.index("missed"),
                              SearchOutcome(schedule, 0, 0.0, 0.0, waited))  # fmt: skip
            ahead, outcome, searched = future.result()  # a search error is raised here
            # The batch searched ahead is the one that came (unless the data differed).
            if [_shape(m) for m in ahead] == [_shape(m) for m in mbs]:
                return self._encode(outcome, "searched" if searched else "guard")
        searched = self._searching()
        plan = self._planner_for(self._iteration, searched)
        with self._lock:
            outcome = plan(placement, structure, mbs)
        return self._encode(outcome, "in-step" if searched else "guard")

    def _submit_next(self, placement: Placement) -> None:
        samples, self._next = self._next, None
        if not self.ahead or samples is None or self._iteration + 1 < self._local_until:
            return
        encoders = placement.encoders
        searched = self._searching()
        plan = self._planner_for(self._iteration + 1, searched)

        def job() -> tuple[list[MicrobatchMeta], SearchOutcome, bool]:
            # A step that balances first hands over a function: its next plan (made in the
            # planning thread) decides the samples, so they are known only here.
            mbs = list(self.to_semu(samples() if callable(samples) else samples))
            structure = MicrobatchStructure(
                len(mbs), {e: tuple(mb.num_subs(e) for mb in mbs) for e in encoders}
            )
            with self._lock:
                return mbs, plan(placement, structure, mbs), searched

        future = self._executor.submit(job)
        future.started = time.perf_counter()
        self._pending = future

    def close(self) -> None:
        """Stop the background thread (a search in flight finishes and is dropped), then the
        search's worker processes, if any."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        self._pending = None
        close = getattr(self.search, "close", None)
        if close is not None:
            close()


DEFAULT_BUDGET_MS = 200.0
"""``--schedule-search-budget-ms`` where the search runs by default."""


def search_budget_ms(run) -> tuple[float, str]:
    """The run's search budget and why: ``--schedule-search-budget-ms`` when given; else
    :data:`DEFAULT_BUDGET_MS` when the search has a CPU core the step does not use (a GPU run,
    whose host mostly waits for kernels, or a host with more cores than its ranks' compute
    threads) or a memory limit needs the search, else 0 (greedy).

    The search is pure Python: on a host whose cores all compute (the CPU main job: 2 ranks
    of 1 thread on 2 cores) it has no core of its own. There its worker, at the lowest
    priority, left the step within a few percent of greedy's time (a crossover measured 0.99),
    and its schedules gained nothing measurable, while SEMU predicted 4-6%.
    """
    given = run.pipeline.schedule_search_budget_ms
    if given is not None:
        return float(given), "--schedule-search-budget-ms"
    if run.pipeline.pipeline_memory_limit_gb is not None:
        return DEFAULT_BUDGET_MS, "the memory limit needs the search"
    if torch.cuda.is_available():
        return DEFAULT_BUDGET_MS, "a GPU run's host has time to search"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    busy = ranks * torch.get_num_threads()
    if (cores or 1) > busy:
        return DEFAULT_BUDGET_MS, f"a spare core: {cores} cores, {busy} compute threads"
    return 0.0, (
        f"no spare CPU core for the search ({cores} cores, {ranks} ranks x "
        f"{torch.get_num_threads()} thread(s)): --schedule-search-budget-ms N searches anyway"
    )


def trainer_search(run, mllm, world_size: int, calibration, budget_ms: float) -> BatchSearch:
    """The run's searcher (:class:`~pipeweaver.search.batch_search.BatchSearch`), bound to SEMU
    of this run's model, cluster and calibration (``--cost-calibration``):
    ``--schedule-search-rollouts`` rollouts seeded by ``--seed``, stopped at ``budget_ms``
    (:func:`search_budget_ms`), ``--schedule-search-workers`` scoring processes, under
    ``--pipeline-memory-limit-gb`` or the GPU's memory.

    Args:
        run: the :class:`~megatron.mllm.run_config.RunConfig`.
        mllm: its model.
        world_size: processes of the run (SEMU's cluster).
        calibration: the run's :class:`~orchestration.calibration.Calibration`, or None.
        budget_ms: the search's time budget per batch (:func:`search_budget_ms`).
    """
    from megatron.mllm.config_files import semu_model_spec
    from megatron.mllm.prediction import run_cluster
    from pipeweaver.semu.simulator import Semu

    cluster = run_cluster(world_size, run.balance.gpus_per_node)
    spec = semu_model_spec(run, mllm)
    p = run.pipeline
    return BatchSearch(
        semu=Semu(spec, cluster, calibration),
        fallback_semu=Semu(spec, cluster, calibration),
        shape=mllm.shape(),
        rollouts=p.schedule_search_rollouts,
        budget_ms=budget_ms,
        seed=run.seed,
        workers=p.schedule_search_workers,
        timeout_s=run.distributed_timeout.total_seconds(),
        memory=Memory.RECOMPUTE if p.pipeline_recompute == "all" else Memory.NONE,
        limit_gb=p.pipeline_memory_limit_gb,
        device_bytes=None if cluster.device.name == "cpu" else cluster.device.hbm_bytes,
    )
