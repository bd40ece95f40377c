# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The searched dynamic pipeline's planner, on a one-process gloo group (the broadcast of a
pipeline of one): what travels, the deadline's fallback, and errors shared by every stage."""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from megatron.mllm.steps.schedule_ahead import SearchedSchedules, semu_microbatch
from megatron.mllm.steps.schedule_wire import decode, encode
from orchestration.measured_guard import BLOCK, PROBE_LENGTH, PROBE_START, MeasuredGuard
from orchestration.metadata import PlanError
from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.fuzz import random_valid_schedule
from pipeweaver.interleave import greedy_dual_queue
from pipeweaver.ir import Compute, Memory, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.search.batch_search import SearchOutcome


@dataclass
class _Sub:
    unit_lens: list[int]
    num_rows: int


@dataclass
class _Language:
    seq_lens: list[int]


@dataclass
class _Microbatch:
    """What the planner reads of a runtime microbatch (``PipelineMicrobatch``)."""

    language: _Language
    subs: dict = field(default_factory=dict)

    def num_subs(self, encoder: str) -> int:
        return len(self.subs.get(encoder, ()))


def _step(seed: int):
    rng = random.Random(seed)
    placement = Placement.interleaved(2, {"vision": 4, "llm": 4}, {})
    mbs = []
    for _ in range(4):
        subs = [_Sub([rng.choice((16, 32))], 8) for _ in range(rng.randint(1, 2))]
        mbs.append(_Microbatch(_Language([rng.choice((60, 120))]), {"vision": subs}))
    structure = MicrobatchStructure(4, {"vision": tuple(mb.num_subs("vision") for mb in mbs)})
    return placement, structure, mbs


def _greedy(placement, structure, mbs):
    mbs = [semu_microbatch(mb) if isinstance(mb, _Microbatch) else mb for mb in mbs]

    def duration(a: Compute) -> float:
        lens, _ = mbs[a.microbatch].compute_sequences(a.module, a.sub)
        return float(sum(lens)) * (2.0 if a.kind.value == "B" else 1.0)

    return greedy_dual_queue(placement, structure, duration)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "f"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.new_group([0])
    dist.destroy_process_group()


def test_a_schedule_travels_exactly_with_every_memory_strategy():
    placement, structure, _ = _step(0)
    rng = random.Random(3)
    for _ in range(20):
        schedule = random_valid_schedule(placement, structure, rng, tuple(Memory))
        outcome = SearchOutcome(schedule, 7, 0.0123, 0.0150, 0.004)
        decoded, record = decode(encode(schedule, 1, outcome), placement, structure)
        assert decoded.actions == schedule.actions
        check(decoded)
        assert (record.source, record.rollouts) == ("searched", 7)
        assert record.predicted_s == pytest.approx(0.0123) and record.greedy_s == 0.015


def _planner(group, search, ahead=True):
    return SearchedSchedules(search, _greedy, group, torch.device("cpu"), ahead, 60.0,
                             lambda samples: [semu_microbatch(mb) for mb in samples])  # fmt: skip


def test_the_next_batch_is_searched_ahead_and_a_late_search_leaves_the_step_to_greedy(group):
    release = threading.Event()
    calls = []

    def search(placement, structure, mbs):
        calls.append(len(mbs))
        if len(calls) > 1:
            assert release.wait(30)
        return SearchOutcome(_greedy(placement, structure, mbs), 3, 1.0, 2.0, 0.5)

    planner = _planner(group, search)
    batches = [_step(s) for s in range(4)]
    placement = batches[0][0]
    # Iteration 1: nothing was searched ahead, so it is searched in the step; the next batch's
    # search starts in the background once the schedule is out.
    planner.prepare(batches[1][2])
    first = planner(*batches[0])
    assert planner.last.source == "in-step" and first.actions
    # Iteration 2: its search is still blocked: greedy runs, and the log says so.
    planner.prepare(batches[2][2])
    second = planner(*batches[1])
    assert planner.last.source == "missed"
    assert second.actions == _greedy(placement, batches[1][1], batches[1][2]).actions
    release.set()
    planner._executor.submit(lambda: None).result(30)  # the background thread has caught up
    # Iteration 3: searched ahead in time.
    planner.prepare(None)
    planner(*batches[2])
    assert planner.last.source == "searched" and planner.last.rollouts == 3
    planner.close()


@pytest.mark.parametrize("local", [True, False], ids=["local-greedy", "memory-limited"])
def test_the_guard_probes_the_search_and_turns_off_one_that_measures_slower(
    group, monkeypatch, local
):
    """Driven by a clock on which a searched batch takes 1.2 s and a greedy one 1.0 s (both
    1.0 s of SEMU's greedy time): the probe's blocks alternate, then greedy runs, ordered by
    every stage itself (no broadcast) until the next probe, and the log line says what was
    measured. Where the stages could not agree on greedy by themselves (a memory limit's ILP),
    the planner keeps sending it."""
    from megatron.mllm.steps import schedule_ahead

    clock = [0.0]
    monkeypatch.setattr(schedule_ahead, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    sent = []
    broadcast = schedule_ahead.distributed.broadcast_from_first
    monkeypatch.setattr(schedule_ahead.distributed, "broadcast_from_first",
                        lambda *a: (sent.append(1), broadcast(*a))[1])  # fmt: skip

    def search(placement, structure, mbs):
        return SearchOutcome(_greedy(placement, structure, mbs), 3, 0.9, 1.0, 0.0)

    def greedy_outcome(placement, structure, mbs):
        return SearchOutcome(_greedy(placement, structure, mbs), 0, 1.0, 1.0, 0.0)

    planner = SearchedSchedules(search, _greedy, group, torch.device("cpu"), True, 60.0,
                                lambda samples: [semu_microbatch(mb) for mb in samples],
                                guard=MeasuredGuard(64), greedy_outcome=greedy_outcome,
                                local_greedy=local)  # fmt: skip
    batches = [_step(s) for s in range(4)]
    sources, broadcasts = [], []
    for i in range(PROBE_START + 64 + 6):
        planner.prepare(batches[(i + 1) % 4][2])
        before = len(sent)
        planner(*batches[i % 4])
        broadcasts.append(len(sent) - before)
        planner._executor.submit(lambda: None).result(30)  # the background job is done
        sources.append(planner.last.source)
        clock[0] += 1.2 if planner.last.source in ("searched", "in-step") else 1.0
    planner.close()
    decided = PROBE_START + PROBE_LENGTH  # the step whose measurement closed the probe
    window = PROBE_START + 64 - decided - 1
    assert broadcasts == [1] * (decided + 1) + [0 if local else 1] * window + [1] * 6
    # The next probe: its first batch greedy (planned in the window's last step), then on.
    assert sources[PROBE_START + 64 :] == ["guard"] + ["searched"] * BLOCK + ["guard"]
    # Batch i was planned during iteration i - 1, in that iteration's block.
    expected = ["in-step"] + [
        "searched" if MeasuredGuard(64).enabled(i - 1) else "guard" for i in range(1, len(sources))
    ]
    assert sources[: PROBE_START + PROBE_LENGTH + 1] == expected[: PROBE_START + PROBE_LENGTH + 1]
    assert set(sources[PROBE_START + PROBE_LENGTH : PROBE_START + 64]) == {"guard"}
    assert planner.last.guard_gain == pytest.approx(1 / 1.2, rel=1e-5)
    assert "the search measured 0.833x greedy's speed" in planner.last.note()


def test_a_batch_the_planner_cannot_schedule_stops_every_stage_with_its_reason(group):
    def search(placement, structure, mbs):
        raise ScheduleError("rank 1: needs 99 bytes, over the rank's memory limit of 7 bytes")

    planner = _planner(group, search, ahead=False)
    planner.limit_note = " (--pipeline-memory-limit-gb 1)"
    with pytest.raises(PlanError, match=r"limit-gb 1\): rank 1: needs 99 bytes"):
        planner(*_step(1))


def test_the_equivalence_runs_memory_limit_makes_the_search_recompute():
    """The limit of the ``pp2-dynamic-memory-limit`` equivalence run (conftest) is one the
    searched schedule meets only by recomputing some pairs, so that run checks recomputation
    chosen by the memory ILP against one process."""
    from conftest import DYNAMIC, forcing_memory_limit_gb
    from equivalence import TINY

    from megatron.mllm.config_files import run_from_flags
    from megatron.mllm.steps.schedule_ahead import search_budget_ms, trainer_search
    from pipeweaver.semu.scenario import build_step

    limit = forcing_memory_limit_gb()
    loaded = run_from_flags([*TINY, *DYNAMIC, "--pipeline-memory-limit-gb", f"{limit:.9f}"], 2)
    search = trainer_search(loaded.run, loaded.model, 2, None, search_budget_ms(loaded.run)[0])
    schedules, mbs, _ = build_step(
        loaded.semu, search.semu.cluster, schedule="dynamic", pad=False, iteration=0
    )
    placement, structure = schedules[0].placement, schedules[0].structure
    outcome = search(placement, structure, mbs[0])
    forwards = [a for r in outcome.schedule.actions for a in r
                if isinstance(a, Compute) and a.kind.value == "F"]  # fmt: skip
    assert any(a.memory is Memory.RECOMPUTE for a in forwards)
    assert not all(a.memory is Memory.RECOMPUTE for a in forwards)
    kept = search.semu.activation_bytes(placement, mbs[0])
    check(outcome.schedule, memory_cap=search.limits(placement), activation_bytes=kept)


def test_the_search_runs_by_default_only_where_it_has_a_core_of_its_own(monkeypatch):
    """On a host whose cores all compute, the pure-Python search would take its time from the
    step: by default it is off there (and on with a spare core, a GPU, or a memory limit)."""
    from equivalence import TINY

    from megatron.mllm.config_files import run_from_flags
    from megatron.mllm.steps import schedule_ahead

    def budget(flags, cores, ranks="2", threads=1):
        monkeypatch.setattr(schedule_ahead.os, "sched_getaffinity", lambda _: set(range(cores)))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
        monkeypatch.setattr(schedule_ahead.torch, "get_num_threads", lambda: threads)
        monkeypatch.setattr(schedule_ahead.torch.cuda, "is_available", lambda: False)
        run = run_from_flags([*TINY, "--pipeline-model-parallel-size", "2",
                              "--pipeline-schedule", "dynamic", *flags], 2).run  # fmt: skip
        return schedule_ahead.search_budget_ms(run)

    assert budget([], cores=2)[0] == 0 and "no spare CPU core" in budget([], cores=2)[1]
    assert budget([], cores=4)[0] == schedule_ahead.DEFAULT_BUDGET_MS
    assert budget([], cores=4, threads=2)[0] == 0
    assert budget(["--schedule-search-budget-ms", "50"], cores=2)[0] == 50
    assert budget(["--pipeline-memory-limit-gb", "1"], cores=2)[0] > 0


class _InProcess:
    """A stand-in for a two-worker SearchPool that scores in this process."""

    workers = 2

    def load(self, score):
        self.score = score

    def evaluate(self, orders):
        return [self.score(o) for o in orders]

    def close(self):
        pass


def test_search_workers_are_capped_and_plan_what_the_same_waves_plan_in_process(monkeypatch):
    """--schedule-search-workers above half the host's cores is one error naming the flag;
    two workers (the cap lifted) plan exactly what the same waves scored in the trainer's own
    process plan, under a memory limit too (its activation bytes travel to the workers)."""
    from conftest import DYNAMIC, forcing_memory_limit_gb
    from equivalence import TINY

    from megatron.mllm.arguments import ConfigError
    from megatron.mllm.config_files import run_from_flags
    from megatron.mllm.steps.schedule_ahead import trainer_search
    from pipeweaver.semu.scenario import build_step

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^--schedule-search-workers must be between 1 and 1 "
                       r"\(half of this host's 2 cores\), got 2$"):  # fmt: skip
        run_from_flags([*TINY, *DYNAMIC, "--schedule-search-workers", "2"], 2)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    limit = forcing_memory_limit_gb()
    flags = [*TINY, *DYNAMIC, "--pipeline-memory-limit-gb", f"{limit:.9f}",
             "--schedule-search-workers", "2"]  # fmt: skip
    loaded = run_from_flags(flags, 2)
    searches = [trainer_search(loaded.run, loaded.model, 2, None, 60_000.0) for _ in range(2)]
    schedules, mbs, _ = build_step(
        loaded.semu, searches[0].semu.cluster, schedule="dynamic", pad=False, iteration=0
    )
    placement, structure = schedules[0].placement, schedules[0].structure
    searches[1]._pool = _InProcess()
    outcomes = [s(placement, structure, mbs[0]) for s in searches]
    assert searches[0]._pool is not None and searches[0]._pool.workers == 2
    searches[0].close()
    assert searches[0]._pool is None
    pooled, in_process = outcomes
    assert pooled.schedule.actions == in_process.schedule.actions
    assert (pooled.rollouts, pooled.predicted_s) == (in_process.rollouts, in_process.predicted_s)
    assert pooled.rollouts == loaded.run.pipeline.schedule_search_rollouts + 1


def test_the_search_runs_in_its_own_process_and_finds_what_it_finds_in_the_trainers(monkeypatch):
    """The trainer's search runs in a worker process of its own (no interpreter lock shared
    with the step): batch after batch, under a memory limit, it returns exactly what the same
    search returns in this process (or raises the same error for a batch over the limit),
    while a search in this process would fail; a worker that dies is one PlanError naming the
    rank and how it ended."""
    import signal

    from conftest import DYNAMIC, forcing_memory_limit_gb
    from equivalence import TINY

    from megatron.mllm.config_files import run_from_flags
    from megatron.mllm.steps.schedule_ahead import trainer_search
    from pipeweaver.search.batch_search import BatchSearch, SearchInWorker
    from pipeweaver.semu.scenario import build_step

    limit = forcing_memory_limit_gb()
    loaded = run_from_flags([*TINY, *DYNAMIC, "--pipeline-memory-limit-gb", f"{limit:.9f}"], 2)
    search = trainer_search(loaded.run, loaded.model, 2, None, 60_000.0)
    batches = []
    for it in range(3):
        schedules, mbs, _ = build_step(
            loaded.semu, search.semu.cluster, schedule="dynamic", pad=False, iteration=it
        )
        batches.append((schedules[0].placement, schedules[0].structure, mbs[0]))

    def outcome(searcher, batch):
        try:
            return searcher(*batch)
        except ScheduleError as e:
            return str(e)

    expected = [outcome(search, batch) for batch in batches]
    assert isinstance(expected[1], str) and not isinstance(expected[0], str)  # both kinds
    remote = SearchInWorker(search, "rank 0", 60.0)
    assert remote.budget_ms == 60_000.0 and remote.pid is None
    monkeypatch.setattr(BatchSearch, "__call__", lambda *_: pytest.fail("searched in the step"))
    try:
        got = [outcome(remote, batch) for batch in batches]
        assert remote.pid is not None and remote.pid != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, remote.pid) == 19  # late costs less than slow
        for a, b in zip(got, expected, strict=True):
            if isinstance(b, str):
                assert a == b
                continue
            assert a.schedule.actions == b.schedule.actions
            assert (a.rollouts, a.predicted_s, a.greedy_s) == (
                b.rollouts,
                b.predicted_s,
                b.greedy_s,
            )
        assert any(a.memory is Memory.RECOMPUTE for r in got[0].schedule.actions for a in r
                   if isinstance(a, Compute))  # fmt: skip
        os.kill(remote.pid, signal.SIGKILL)
        with pytest.raises(PlanError, match=r"^the search worker of rank 0 \(pid \d+\) died "
                           r"\(killed by signal 9\); --schedule-search-budget-ms 0"):  # fmt: skip
            remote(*batches[0])
    finally:
        remote.close()
    assert remote.pid is None
