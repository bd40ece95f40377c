# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Holds the schedule search's predicted gain against the run's own clock.

SEMU chooses the searched schedule because it predicts it faster than greedy's; whether the
step really is faster depends on how well SEMU knows this host, and, where the search has no
core of its own, on what the search's CPU time costs the step. So the pipeline's planner (its
first stage) measures it, as an interleaved A/B inside the run:

1. **probe**: from iteration :data:`PROBE_START`, :data:`PAIRS` pairs of blocks of
   :data:`BLOCK` iterations, the search on in the first block of each pair and off (greedy,
   nothing searched in the background) in the second. The pattern depends only on the
   iteration, so every run probes the same iterations;
2. **compare**: each iteration's measured time (between two steps' schedules, on the planner)
   over SEMU's predicted time of greedy's schedule for that batch, which both arms compute,
   so that a heavier batch does not count against its arm; the median of each arm over its
   blocks, every block's first iteration left out (its schedule was chosen in the block
   before). The measured gain is ``median(off) / median(on)``;
3. **decide**: the search stays on where the gain is at least ``1 + MARGIN``, else the run
   takes greedy's order until the next probe, ``interval`` iterations after this one started
   (``--schedule-search-guard-interval``; 0 turns the guard off: the search runs on every
   batch).

Pure Python, no collectives: the planner alone decides and its choice travels with the
schedule it broadcasts. A decision depends on measured time, so after the first probe the
schedules of two runs may differ (their losses do not: every schedule computes the same
gradients); within the probe they are those of every run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

PROBE_START = 8
"""The first probe's first iteration (earlier ones always search: caches warm up)."""

BLOCK = 4
"""Iterations per block of a probe."""

PAIRS = 3
"""On/off block pairs per probe."""

MARGIN = 0.01
"""The measured gain the search must show to stay on (greedy is the default that cannot
mispredict, so a tie goes to it)."""

PROBE_LENGTH = 2 * PAIRS * BLOCK
"""Iterations of one probe."""


def check_interval(interval: int, name: str = "the guard's interval") -> int:
    """``interval`` if it is 0 (no guard) or at least one probe long.

    Raises:
        ValueError: naming ``name`` (the trainer passes its flag).
    """
    if interval < 0:
        raise ValueError(f"{name} must be >= 0, got {interval}")
    if 0 < interval < PROBE_LENGTH:
        raise ValueError(
            f"{name} must be 0 (no guard) or at least one probe of {PROBE_LENGTH} iterations, "
            f"got {interval}"
        )
    return interval


@dataclass
class SearchGuard:
    """The planner's probe-and-decide state (see the module docstring).

    Args:
        interval: iterations from one probe's start to the next's (0: no guard).
    """

    interval: int
    """Iterations from one probe's start to the next's (0: the guard is off)."""

    gain: float | None = None
    """The latest probe's measured gain (None before the first decision)."""

    searching: bool = True
    """The latest decision: whether the search runs outside probes."""

    _probe_start: int = PROBE_START
    _samples: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})

    def __post_init__(self) -> None:
        check_interval(self.interval)

    def _probe_arm(self, iteration: int) -> bool | None:
        """Within a probe, whether ``iteration`` is in a search-on block; None outside."""
        offset = iteration - self._probe_start
        if not self.interval or not 0 <= offset < PROBE_LENGTH:
            return None
        return (offset // BLOCK) % 2 == 0

    def search(self, iteration: int) -> bool:
        """Whether the search runs during ``iteration`` (for the batch after it), or, in the
        step, for its own batch."""
        arm = self._probe_arm(iteration)
        return self.searching if arm is None else arm

    def probing(self, iteration: int) -> bool:
        """Whether ``iteration`` is part of a probe."""
        return self._probe_arm(iteration) is not None

    def record(self, iteration: int, measured_s: float, greedy_predicted_s: float) -> None:
        """One iteration's measured time and SEMU's greedy time of its batch; the probe's last
        iteration decides."""
        arm = self._probe_arm(iteration)
        if arm is None:
            return
        offset = iteration - self._probe_start
        if offset % BLOCK and greedy_predicted_s > 0 and measured_s > 0:
            self._samples[arm].append(measured_s / greedy_predicted_s)
        if offset == PROBE_LENGTH - 1:
            self._decide()

    def _decide(self) -> None:
        on, off = self._samples[True], self._samples[False]
        if on and off:
            self.gain = statistics.median(off) / statistics.median(on)
            self.searching = self.gain >= 1.0 + MARGIN
        self._samples = {True: [], False: []}
        self._probe_start += self.interval

    @property
    def next_probe(self) -> int:
        """The next probe's first iteration."""
        return self._probe_start
