# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A searched schedule as the pipeline's planner broadcasts it, and what the log says of it.

The planner (each pipeline's first stage, :mod:`megatron.mllm.steps.schedule_ahead`) sends
every stage one fixed-size int64 vector: a header (where the schedule came from, what the
search found, what the search guard measured, and a window in which every stage orders its own
batches), then every stage's computes in order with their memory strategies. The other stages
lower the same order with the same deterministic lowering, so every stage runs the same
schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeweaver.dataflow import MicrobatchStructure, all_computes
from pipeweaver.ir import Compute, Kind, Memory, ScheduleError
from pipeweaver.lowering import lower
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.search.batch_search import SearchOutcome

MEMORY_CODES: tuple[Memory, ...] = (
    Memory.NONE,
    Memory.RECOMPUTE,
    Memory.OFFLOAD,
    Memory.SELECTIVE,
    Memory.LAYERS,
)
"""The memory strategy of a compute as it travels: its index here (with :attr:`Memory.LAYERS`,
plus 8 x its count of first layers)."""

_STRATEGY_WORDS = 1 << 16
"""Codes per compute in the vector: a strategy code and the layer count fit below it."""


def _strategy_code(a: Compute) -> int:
    return MEMORY_CODES.index(a.memory) + 8 * a.recompute_layers


def _with_strategy(a: Compute, code: int) -> Compute:
    return a.with_memory(MEMORY_CODES[code % 8], code // 8)


SOURCES: tuple[str, ...] = ("greedy", "searched", "missed", "in-step", "guard")
"""Where a step's schedule came from, as it travels (index) and as the log prints it:
``greedy`` (no search), ``searched`` (made ahead, in time), ``missed`` (made ahead, not in
time: greedy ran), ``in-step`` (searched in the step, nothing was made ahead), ``guard``
(greedy, because the search's measured gain is being probed or did not pay:
:mod:`orchestration.measured_guard`)."""

HEADER_WORDS = 7
"""Words before the computes: source, rollouts, predicted us, greedy us, search us, the
guard's gain in ppm, and the step before which every stage orders its own batches
(:data:`LOCAL_UNTIL_WORD`)."""

LOCAL_UNTIL_WORD = 6
"""The header word that opens a window of steps ordered on every stage (0: none)."""


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """What the latest step's schedule was, for the log line and the metrics."""

    source: str
    """One of :data:`SOURCES`."""

    rollouts: int
    """Rollouts of the search behind it (0 for greedy)."""

    predicted_s: float
    """SEMU's step time of the schedule that ran (0 when unknown)."""

    greedy_s: float
    """SEMU's step time of the greedy order (0 when unknown)."""

    search_s: float
    """Seconds the search took (in the background, unless ``in-step``)."""

    recomputed: int = 0
    """Forward/backward pairs of the schedule that recompute (or offload) their activations."""

    pairs: int = 0
    """Forward/backward pairs of the schedule."""

    guard_gain: float = 0.0
    """The search guard's latest measured gain (greedy's time over the search's, per SEMU
    greedy second); 0 before its first probe has decided, or without a guard."""

    def note(self) -> str:
        """The log line's part: ``schedule: searched 64 rollouts 85.1 ms, SEMU 153.2 ms
        (greedy 160.1 ms)``."""
        if self.source == "greedy":
            return "schedule: greedy"
        if self.source == "guard":
            if not self.guard_gain:
                return "schedule: greedy (guard: measuring the search against greedy)"
            return (
                f"schedule: greedy (guard: the search measured {self.guard_gain:.3f}x greedy's "
                f"speed, off until the next probe)"
            )
        if self.source == "missed":
            return (
                f"schedule: greedy (search missed its deadline, {self.search_s * 1e3:.1f} ms so "
                f"far)"
            )
        text = (
            f"schedule: {self.source} {self.rollouts} rollouts {self.search_s * 1e3:.1f} ms, "
            f"SEMU {self.predicted_s * 1e3:.1f} ms (greedy {self.greedy_s * 1e3:.1f} ms)"
        )
        if self.recomputed:
            text += f", {self.recomputed}/{self.pairs} pairs recompute or offload"
        if self.guard_gain:
            text += f", guard: measured {self.guard_gain:.3f}x"
        return text

    def record(self) -> dict:
        """The ``schedule_search`` entry of ``--metrics-jsonl``."""
        return {
            "source": self.source,
            "rollouts": self.rollouts,
            "predicted_s": self.predicted_s,
            "greedy_s": self.greedy_s,
            "search_s": self.search_s,
            "recomputed_pairs": self.recomputed,
            "pairs": self.pairs,
            "guard_gain": self.guard_gain,
        }


def encode(schedule: Schedule, source: int, outcome: SearchOutcome | None,
           guard_gain: float | None = None, local_until: int = 0) -> np.ndarray:  # fmt: skip
    """A schedule as the fixed-size int64 vector the planner broadcasts: a header, then every
    stage's computes in order, each ``index * 65536 + strategy code`` with ``index`` its
    position in :func:`pipeweaver.dataflow.all_computes` order."""
    index = {a: i for i, a in enumerate(all_computes(schedule.placement, schedule.structure))}
    body = [
        index[a.key] * _STRATEGY_WORDS + _strategy_code(a)
        for actions in schedule.actions
        for a in actions
        if isinstance(a, Compute)
    ]
    if len(body) != len(index):
        raise ScheduleError(f"the schedule runs {len(body)} computes, the step has {len(index)}")
    header = [source, 0, 0, 0, 0, round((guard_gain or 0.0) * 1e6), local_until]
    if outcome is not None:
        header[1:5] = [
            outcome.rollouts,
            round(outcome.predicted_s * 1e6),
            round(outcome.greedy_s * 1e6),
            round(outcome.search_s * 1e6),
        ]
    return np.asarray(header + body, dtype=np.int64)


def decode(words: np.ndarray, placement: Placement, structure: MicrobatchStructure
           ) -> tuple[Schedule, ScheduleRecord]:  # fmt: skip
    """Inverse of :func:`encode`: the lowered schedule and what the planner said of it."""
    computes = list(all_computes(placement, structure))
    order: list[list[Compute]] = [[] for _ in range(placement.num_ranks)]
    for w in words[HEADER_WORDS:]:
        a = _with_strategy(computes[int(w) // _STRATEGY_WORDS], int(w) % _STRATEGY_WORDS)
        order[placement.rank_of(a.module, a.chunk)].append(a)
    source, rollouts, predicted, greedy, search, gain, _ = (int(x) for x in words[:HEADER_WORDS])
    schedule = lower(Schedule(placement, structure, tuple(tuple(o) for o in order), "dynamic"))
    forwards = [a for o in order for a in o if a.kind is Kind.F]
    record = ScheduleRecord(
        SOURCES[source], rollouts, predicted / 1e6, greedy / 1e6, search / 1e6,
        sum(a.memory is not Memory.NONE for a in forwards), len(forwards), gain / 1e6,
    )  # fmt: skip
    return schedule, record


def words_length(placement: Placement, structure: MicrobatchStructure) -> int:
    """Length of the vector :func:`encode` makes for this step (every stage knows it)."""
    return HEADER_WORDS + sum(1 for _ in all_computes(placement, structure))
