# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""DIP's Megatron baseline layout: stages of balanced parameters, and Megatron's schedules on it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure, all_computes
from pipeweaver.generators import interleaved_one_f_one_b, no_pipelining, one_f_one_b
from pipeweaver.ir import MODULES, Compute, ScheduleError
from pipeweaver.placement import ChunkPlacement, Placement


def _layer_params(seed: int) -> dict[str, list[float]]:
    """A small model: integer parameter counts per layer, heavier edges as real models have."""
    rng = np.random.default_rng(seed)
    out = {
        "vision": [int(x) for x in rng.integers(1, 9, size=3)],
        "audio": [int(x) for x in rng.integers(1, 9, size=2)],
        "llm": [int(x) for x in rng.integers(1, 9, size=4)],
    }
    out["llm"][0] += 6  # embedding
    out["llm"][-1] += 6  # output layer
    return out


def _best_max_stage(weights: list[float], stages: int) -> float:
    """Brute force: the smallest largest stage sum over every contiguous split."""
    n = len(weights)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = (0, *cuts, n)
        best = min(best, max(sum(weights[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def _stage_params(pl: Placement, params: dict[str, list[float]]) -> list[float]:
    return [
        sum(sum(params[m][slice(*pl.layer_range(m, c))]) for m, c in stage) for stage in pl.stages()
    ]


@pytest.mark.parametrize("seed,p,k", itertools.product(range(4), [2, 3], [1, 2]))
def test_balanced_stages_is_the_brute_force_optimum(seed, p, k):
    params = _layer_params(seed)
    pl = Placement.balanced_stages(p, params, k)
    flat = [w for m in MODULES for w in params.get(m, [])]
    stages = pl.stages()
    assert len(stages) == p * k
    # Stage v on rank v mod P, every chunk of a stage on it, modules in flow order.
    for v, stage in enumerate(stages):
        assert {pl.rank_of(m, c) for m, c in stage} == {v % p}
    order = [(m, c) for stage in stages for m, c in stage]
    assert order == [(m, c) for m in pl.modules for c in range(pl.num_chunks(m))]
    assert {m: pl.num_layers(m) for m in pl.modules} == {m: len(w) for m, w in params.items()}
    # Exactly the balanced optimum (so within one layer's parameters of it).
    assert max(_stage_params(pl, params)) == _best_max_stage(flat, p * k)
    assert sum(_stage_params(pl, params)) == sum(flat)


def test_balanced_stages_spans_an_encoder_over_stages():
    # 4 4 | 4 4 | 4 3 | 1 1 3: the largest stage holds 8 (two vision layers; no split does
    # better), and stage 2 ends the vision encoder and starts the LLM on one rank.
    pl = Placement.balanced_stages(4, {"vision": [4] * 5, "llm": [3, 1, 1, 3]})
    assert [(cp.rank, cp.start, cp.stop) for cp in pl.chunks["vision"]] == [
        (0, 0, 2),
        (1, 2, 4),
        (2, 4, 5),
    ]
    assert [(cp.rank, cp.start, cp.stop) for cp in pl.chunks["llm"]] == [(2, 0, 1), (3, 1, 4)]
    assert pl.stages() == [
        [("vision", 0)],
        [("vision", 1)],
        [("vision", 2), ("llm", 0)],
        [("llm", 1)],
    ]


def test_balanced_stages_rejects_bad_input():
    with pytest.raises(ScheduleError, match="8 non-empty pipeline stages"):
        Placement.balanced_stages(4, {"vision": [1], "llm": [1, 1]}, 2)
    with pytest.raises(ScheduleError, match="llm"):
        Placement.balanced_stages(2, {"vision": [1, 1]})
    with pytest.raises(ScheduleError, match="vision layer 1"):
        Placement.balanced_stages(2, {"vision": [1, -1], "llm": [1, 1]})


def _structure(m: int) -> MicrobatchStructure:
    # 0, 1 and several subs per encoder, varying over microbatches.
    return MicrobatchStructure(
        m,
        {
            "vision": tuple((mb * 7) % 4 for mb in range(m)),
            "audio": tuple(mb % 2 for mb in range(m)),
        },
    )


def _runs_every_compute_once(s) -> None:
    ran = sorted(a.key for rank in s.actions for a in rank if isinstance(a, Compute))
    assert ran == sorted(all_computes(s.placement, s.structure))


@pytest.mark.parametrize("seed,p,m", itertools.product(range(3), [2, 3, 4], [1, 3, 6]))
def test_1f1b_on_the_balanced_layout_passes_the_checker(seed, p, m):
    pl = Placement.balanced_stages(p, _layer_params(seed))
    s = one_f_one_b(pl, _structure(m))
    check(s)
    _runs_every_compute_once(s)


@pytest.mark.parametrize("seed,p,m", itertools.product(range(2), [2, 3], [3, 4, 6, 8]))
def test_interleaved_on_the_balanced_layout_passes_the_checker(seed, p, m):
    pl = Placement.balanced_stages(p, _layer_params(seed), 2)
    if m < p or m % p:  # megatron-core's rule (groups of P): rejected alike
        with pytest.raises(ScheduleError):
            interleaved_one_f_one_b(pl, _structure(m))
        return
    s = interleaved_one_f_one_b(pl, _structure(m))
    check(s)
    _runs_every_compute_once(s)


def test_one_rank_balanced_runs_without_pipelining():
    pl = Placement.balanced_stages(1, _layer_params(0))
    s = no_pipelining(pl, _structure(3))
    check(s)
    _runs_every_compute_once(s)


def test_1f1b_rejects_stages_off_megatron_round_robin():
    # DIP's interleaved layout: P vision stages, then P LLM stages: 2 per rank, not 1F1B's.
    pl = Placement.interleaved(2, {"vision": 2, "llm": 2}, {})
    with pytest.raises(ScheduleError, match="one pipeline stage per rank"):
        one_f_one_b(pl, _structure(2))
    # The first stage on rank 1: Megatron's stage 0 is rank 0's.
    odd = Placement(
        2,
        {
            "vision": (ChunkPlacement(1, 0, 1),),
            "llm": (ChunkPlacement(1, 0, 1), ChunkPlacement(0, 1, 2)),
        },
    )
    with pytest.raises(ScheduleError, match="stage 0 on rank 0"):
        one_f_one_b(odd, _structure(2))


@pytest.mark.parametrize("m", [1, 4, 7])
def test_1f1b_runs_an_encoder_across_stages(m):
    # Vision over ranks 0-2, LLM chunk 0 behind the last vision chunk on rank 2.
    pl = Placement.balanced_stages(4, {"vision": [4] * 5, "llm": [3, 1, 1, 3]})
    s = one_f_one_b(pl, MicrobatchStructure(m, {"vision": tuple(mb % 3 for mb in range(m))}))
    check(s)
    _runs_every_compute_once(s)
    # Rank 2's forward of a microbatch: its vision chunk for every sub, then LLM chunk 0.
    first = [a for a in s.computes(2) if a.microbatch == m - 1 and a.kind.value == "F"]
    subs = (m - 1) % 3
    assert [(a.module, a.chunk, a.sub) for a in first] == [
        *(("vision", 2, j) for j in range(subs)),
        ("llm", 0, 0),
    ]
