# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The schedule search with worker processes (issue 12, item 5): waves of selections under a
virtual loss, evaluated by a :class:`~pipeweaver.search.search_pool.SearchPool`.

The oracles: with one worker the wave loop is exactly the sequential search it replaced
(tests/pipeweaver/reference_mcts.py, a copy of it); with two, a real pool gives exactly what
the same waves evaluated in this process give; on the small instance of
tests/pipeweaver/test_mcts.py the search still finds the exhaustive optimum. This host may
have two cores (the cap is then 1): the tests lift the cap.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest
import reference_mcts
from mcts_scorers import ExitAfter, HeavyModules, Stuck, token_cost
from test_mcts import FOUR, TWO, _four_optimum, _instance, _semu

from pipeweaver.checker import check
from pipeweaver.search.mcts import OrderEvaluator, search_schedule, tree_search
from pipeweaver.search.search_pool import (
    SearchPool,
    SearchPoolError,
    cached_many,
    check_workers,
    max_search_workers,
)
from pipeweaver.semu.simulator import Semu

HERE = Path(__file__).resolve().parent

FIELDS = ("order", "time_s", "first_time_s", "rollouts", "exhausted")


@functools.cache
def _picklable_semu() -> Semu:
    """test_mcts's SEMU with its compute times in a module the workers can import."""
    base = _semu()
    return Semu(base.spec, base.cluster, compute_cost_fn=token_cost)


def _evaluator(case) -> OrderEvaluator:
    placement, structure, mbs = _instance(case)
    return OrderEvaluator(placement, structure, mbs, _picklable_semu())


def _fields(outcome) -> tuple:
    return tuple(getattr(outcome, f) for f in FIELDS)


@pytest.fixture(scope="module")
def pool():
    """Two workers that can import this directory's helpers, shared by the module's tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        with SearchPool(2, max_workers=2, timeout_s=60) as p:
            yield p


@pytest.mark.parametrize("case", [FOUR, TWO], ids=["four", "two"])
def test_one_worker_is_the_sequential_search(case):
    """Same orders evaluated in the same sequence, same outcome, for several settings."""
    ev = _evaluator(case)
    settings = [
        dict(rollouts=150, seed=0),
        dict(rollouts=150, seed=1, rollouts_per_expansion=3),
        dict(rollouts=80, seed=2, maximize=True),
        dict(rollouts=150, seed=3, alpha=2.0, beta=0.1),
        dict(rollouts=0, seed=0),
    ]
    if case is TWO:
        settings.append(dict(rollouts=10**5, seed=3))  # enumerated completely
    for kw in settings:
        old, new = [], []
        ref = reference_mcts.tree_search(ev.space, lambda o: (old.append(o), ev(o))[1], **kw)
        out = tree_search(ev.space, lambda o: (new.append(o), ev(o))[1], workers=1, **kw)
        assert _fields(out) == _fields(ref), kw
        assert new == old, kw
    assert ref.exhausted == (case is TWO)


@pytest.mark.parametrize("case", [FOUR, TWO], ids=["four", "two"])
def test_two_workers_give_the_in_process_waves(case, pool):
    """A real pool of two gives exactly the W=2 waves evaluated in this process, run after
    run; W=2 is another search than W=1 (other nodes per wave), not a noisier one."""
    placement, structure, mbs = _instance(case)
    seen = {1: [], 2: []}
    for w in (1, 2):
        ev = _evaluator(case)
        out = tree_search(
            ev.space, lambda o: (seen[w].append(o), ev(o))[1], rollouts=200, seed=5, workers=w
        )
    inproc = out
    assert (seen[1] != seen[2]) == (case is FOUR)  # TWO's 200 rollouts pick alike
    runs = []
    for _ in range(2):
        ev = _evaluator(case)
        pool.load(ev)
        runs.append(
            tree_search(
                ev.space,
                ev,
                rollouts=200,
                seed=5,
                workers=2,
                evaluate_many=functools.partial(cached_many, ev._cache, pool.evaluate),
            )
        )
        res = search_schedule(
            placement, structure, mbs, _picklable_semu(), rollouts=200, seed=5, workers=2,
            pool=pool,
        )  # fmt: skip
        assert (res.step_time_s, res.rollouts, res.workers) == (inproc.time_s, 201, 2)
        assert res.order == ev.space.to_groups(inproc.order)
        check(res.schedule)
    assert _fields(runs[0]) == _fields(runs[1]) == _fields(inproc)
    assert runs[0].waves == inproc.waves < 200  # two nodes per wave


@pytest.mark.parametrize("seed", [0, 1])
def test_two_workers_find_the_exhaustive_optimum(seed, pool):
    """test_mcts's instance (P=2, 4 microbatches, 2 modules): W=2 with 700 rollouts finds the
    exact optimum, as W=1 does."""
    ex, greedy = _four_optimum()
    placement, structure, mbs = _instance(FOUR)
    res = search_schedule(
        placement, structure, mbs, _picklable_semu(), rollouts=700, seed=seed, workers=2,
        pool=pool,
    )  # fmt: skip
    assert res.step_time_s == ex.step_time_s < greedy == res.greedy_step_time_s
    assert res.workers == 2 and res.rollouts == 701


def test_small_tree_is_exhausted_with_two_workers(pool):
    """The wave loop stops selecting once the root is exhausted; the result is exact."""
    ev = _evaluator(TWO)
    placement, structure, mbs = _instance(TWO)
    res = search_schedule(
        placement, structure, mbs, None, rollouts=10**5, seed=3, evaluator=ev, workers=2, pool=pool
    )
    assert res.exhausted and res.rollouts < 10**5
    assert res.step_time_s == min(ev._cache.values())
    assert res.evaluations == len(ev._cache)  # the pool's results went into the cache


def test_time_budget_and_own_pool():
    """budget_ms 0 keeps greedy; without a pool, search_schedule starts and closes one."""
    placement, structure, mbs = _instance(FOUR)
    res = search_schedule(
        placement, structure, mbs, _picklable_semu(), rollouts=10**6, budget_ms=0, seed=0,
        workers=2, max_workers=2,
    )  # fmt: skip
    assert res.rollouts == 1 and res.step_time_s == res.greedy_step_time_s
    ev = _evaluator(FOUR)
    out = tree_search(ev.space, ev, rollouts=10**6, seed=0, budget_ms=30, workers=2)
    assert out.rollouts > 1 and out.waves >= 1  # stops after the wave crossing 30 ms


def test_workers_above_the_cap_are_rejected():
    cap = max_search_workers()
    assert cap == max(1, os.cpu_count() // 2)
    placement, structure, mbs = _instance(TWO)
    with pytest.raises(ValueError, match=f"between 1 and {cap} .*half of this host's"):
        search_schedule(placement, structure, mbs, _semu(), rollouts=1, workers=cap + 1)
    with pytest.raises(ValueError, match="between 1 and 2"):
        SearchPool(3, max_workers=2)
    with pytest.raises(ValueError, match="--schedule-search-workers must be between 1"):
        check_workers(0, name="--schedule-search-workers")
    assert check_workers(cap) == cap


def test_bad_scorers_and_pools_are_clear_errors(pool):
    placement, structure, mbs = _instance(TWO)
    with pytest.raises(ValueError, match="picklable"):
        search_schedule(
            placement, structure, mbs, _semu(), rollouts=4, workers=2, pool=pool,
            evaluate=lambda order: 1.0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="pool has 2 workers"):
        search_schedule(placement, structure, mbs, _semu(), rollouts=4, workers=1, pool=pool)
    assert pool.evaluate([]) == []  # the pool is still usable


def test_workers_import_neither_torch_nor_the_trainer(pool):
    """A worker is a fresh interpreter: unpickling an evaluator imports pipeweaver alone."""
    ev = _evaluator(FOUR)
    pool.load(HeavyModules(ev))
    assert pool.evaluate([ev.space.default()] * 2) == [0.0, 0.0]


def _pool(**kw) -> SearchPool:
    env = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", env)
        return SearchPool(2, max_workers=2, **kw)


def test_a_worker_dying_mid_search_is_a_clear_error():
    """A worker that exits mid-search, or is killed between waves, stops the search at once
    with one error naming it; the pool is then closed."""
    ev = _evaluator(FOUR)
    with _pool(timeout_s=30) as p:
        p.load(ExitAfter(ev, 5))
        start = time.monotonic()
        with pytest.raises(SearchPoolError, match=r"^error: schedule search worker \d \(pid \d+\) "
                           r"died \(exit status 3\) while scoring 2 orders"):  # fmt: skip
            tree_search(
                ev.space, ev, rollouts=100, seed=0, workers=2,
                evaluate_many=functools.partial(cached_many, {}, p.evaluate),
            )  # fmt: skip
        assert time.monotonic() - start < 10
        with pytest.raises(SearchPoolError, match="died"):
            p.evaluate([ev.space.default()])  # broken for good
    with _pool(timeout_s=30) as p:
        p.load(ev)
        assert len(p.evaluate([ev.space.default()] * 3)) == 3
        os.kill(p.pids[1], signal.SIGKILL)
        with pytest.raises(SearchPoolError, match=r"worker 1 .* died \(killed by signal 9\)"):
            p.evaluate([ev.space.default()] * 2)


def test_a_stuck_worker_times_out():
    ev = _evaluator(TWO)
    with _pool(timeout_s=1.0) as p:
        p.load(Stuck())
        start = time.monotonic()
        with pytest.raises(SearchPoolError, match=r"worker\(s\) 0, 1 gave no answer in 1 s"):
            p.evaluate([ev.space.default()] * 2)
        assert time.monotonic() - start < 5
    assert all(code is not None for code in [w.process.poll() for w in p._workers])
