# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The static checker against 200 random valid and 200 random invalid schedules."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.fuzz import MUTATIONS, random_invalid_schedule, random_valid_schedule
from pipeweaver.ir import ScheduleError
from pipeweaver.placement import Placement


def _instance(rng: random.Random):
    p = rng.choice([2, 3, 4])
    layers = {"vision": p * 2, "audio": p * 2, "llm": p * 3}
    ks = {m: rng.choice([1, 2]) for m in layers}
    placement = Placement.interleaved(p, layers, ks)
    m = rng.randint(1, 5)
    subs = {e: tuple(rng.choice([0, 1, 2, 3]) for _ in range(m)) for e in ("vision", "audio")}
    return placement, MicrobatchStructure(m, subs)


def test_200_random_valid_schedules_pass_the_checker():
    rng = random.Random(0)
    for n in range(200):
        placement, structure = _instance(rng)
        schedule = random_valid_schedule(placement, structure, rng)
        try:
            check(schedule)
        except ScheduleError as e:  # pragma: no cover - the failure message is the point
            pytest.fail(f"fuzzed valid schedule {n} rejected: {e}\n{schedule}")


def test_200_random_invalid_schedules_are_rejected_naming_the_action():
    rng = random.Random(1)
    seen = Counter()
    for n in range(200):
        placement, structure = _instance(rng)
        schedule, mutation = random_invalid_schedule(
            placement, structure, rng, mutation=MUTATIONS[n % len(MUTATIONS)]
        )
        seen[mutation] += 1
        with pytest.raises(ScheduleError) as info:
            check(schedule)
        message = str(info.value)
        assert message.startswith("rank ") and "'" in message, (mutation, message)
    assert set(seen) == set(MUTATIONS), seen
