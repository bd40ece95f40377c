# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Holds a feature's predicted gain against the run's own clock: an A/B inside the run.

The schedule search (SEMU predicts its schedule faster than greedy's) and batch post-balancing
(the cost model predicts the balanced step faster than Megatron's assignment) act on
predictions. Whether the step really is faster depends on how well the model knows this host,
and, where the feature's work has no core of its own, on what its CPU time costs the step. So
the run measures it:

1. **probe**: from iteration :data:`PROBE_START`, :data:`PAIRS` pairs of blocks of
   :data:`BLOCK` iterations, the feature on in the first block of each pair and off (nothing of
   it done, in the step or in the background) in the second. The pattern depends only on the
   iteration, so every run, and every rank, probes the same iterations;
2. **compare**: each iteration's measured time, divided by a mode-neutral prediction of its
   batch's work where the caller has one that follows time (the search: SEMU's greedy time of
   the batch, so that a heavier batch does not count against its arm; post-balancing: none);
   the median of each arm over its blocks, every block's first iteration left out (it was
   prepared in the block before, or paid for the switch). The measured gain is
   ``median(off) / median(on)``;
3. **decide**: the feature stays on where the gain is at least ``1 + MARGIN``, else it is off
   until the next probe, ``interval`` iterations after this one started (the feature's
   ``--...-guard-interval`` flag; 0 turns the guard off: the feature is always on).

Pure Python, no collectives: a caller that needs every rank to decide alike feeds every rank
the same measured values (gathered), or lets one rank decide and sends its choice. A decision
depends on measured time, so after the first probe two runs may differ in what they ran (not in
what they learn: both arms compute the same gradients); within a probe they are alike.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

PROBE_START = 8
"""The first probe's first iteration (earlier ones always run the feature: caches and fits
warm up)."""

BLOCK = 4
"""Iterations per block of a probe."""

PAIRS = 3
"""On/off block pairs per probe."""

MARGIN = 0.01
"""The measured gain the feature must show to stay on (off is the default that cannot
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
class MeasuredGuard:
    """The probe-and-decide state (see the module docstring).

    Args:
        interval: iterations from one probe's start to the next's (0: no guard).
    """

    interval: int
    """Iterations from one probe's start to the next's (0: the guard is off)."""

    gain: float | None = None
    """The latest probe's measured gain (None before the first decision)."""

    on: bool = True
    """The latest decision: whether the feature runs outside probes."""

    _probe_start: int = PROBE_START
    _samples: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})

    def __post_init__(self) -> None:
        check_interval(self.interval)

    def _probe_arm(self, iteration: int) -> bool | None:
        """Within a probe, whether ``iteration`` is in a feature-on block; None outside."""
        offset = iteration - self._probe_start
        if not self.interval or not 0 <= offset < PROBE_LENGTH:
            return None
        return (offset // BLOCK) % 2 == 0

    def enabled(self, iteration: int) -> bool:
        """Whether the feature runs for ``iteration``."""
        arm = self._probe_arm(iteration)
        return self.on if arm is None else arm

    def probing(self, iteration: int) -> bool:
        """Whether ``iteration`` is part of a probe."""
        return self._probe_arm(iteration) is not None

    def record(self, iteration: int, measured_s: float, work: float) -> None:
        """One iteration's measured time and the mode-neutral prediction of its batch's work
        (any unit; 1 where there is none); the probe's last iteration decides."""
        arm = self._probe_arm(iteration)
        if arm is None:
            return
        offset = iteration - self._probe_start
        if offset % BLOCK and work > 0 and measured_s > 0:
            self._samples[arm].append(measured_s / work)
        if offset == PROBE_LENGTH - 1:
            self._decide()

    def _decide(self) -> None:
        on, off = self._samples[True], self._samples[False]
        if on and off:
            self.gain = statistics.median(off) / statistics.median(on)
            self.on = self.gain >= 1.0 + MARGIN
        self._samples = {True: [], False: []}
        self._probe_start += self.interval

    @property
    def next_probe(self) -> int:
        """The next probe's first iteration."""
        return self._probe_start

    def state_dict(self) -> dict[str, Any]:
        """The decision, the probe's clock and a probe's samples so far, for a resume."""
        state = asdict(self)
        state["_samples"] = {str(k): list(v) for k, v in self._samples.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (the interval stays this run's)."""
        self.gain = state["gain"]
        self.on = bool(state["on"])
        self._probe_start = int(state["_probe_start"])
        self._samples = {k == "True": list(v) for k, v in state["_samples"].items()}


def taking_turns(
    interval: int, other: "MeasuredGuard | AlternatingArms | None", name: str, other_name: str
) -> MeasuredGuard | None:
    """A guard of ``interval`` (its flag ``name``) for a feature that runs in the same steps as
    the feature ``other`` guards (its flag ``other_name``): two probes at once would each
    measure both features toggled together, so the new guard probes right after ``other``'s
    probes end, every ``interval`` iterations, which must then be ``other``'s.

    Returns:
        The guard; None with ``interval`` 0.

    Raises:
        ValueError: the two intervals differ or are shorter than two probes (the probes would
            meet), or ``other`` is an alternation (each of its blocks toggles its feature),
            naming both flags.
    """
    if not interval:
        return None
    if isinstance(other, AlternatingArms):
        raise ValueError(
            f"{other_name} toggles its feature in every block, which {name} {interval} would "
            f"measure as its own: set {name} 0 while alternating"
        )
    guard = MeasuredGuard(interval)
    if other is not None and other.interval:
        if other.interval != interval:
            raise ValueError(
                f"{name} {interval} and {other_name} {other.interval} must be equal: the two "
                "probes take turns (each would measure the other's feature toggled too)"
            )
        if interval < 2 * PROBE_LENGTH:
            raise ValueError(
                f"{name} {interval} and {other_name} {other.interval} must be at least two "
                f"probes ({2 * PROBE_LENGTH} iterations) for their probes to take turns"
            )
        guard._probe_start = other.next_probe + PROBE_LENGTH
    return guard


@dataclass
class AlternatingArms:
    """A crossover A/B for benchmarks, in place of the guard: the feature on and off in
    alternate blocks for the whole run, nothing decided.

    Two runs whose patterns are opposite (``first_on`` True in one, False in the other) run
    every batch once in each arm, so the product of their within-run ratios cancels both what
    the batches weigh and how the host drifts between the runs (each ratio compares iterations
    seconds apart). ``tools/bench/post_balance_cpu.py`` runs its pairs this way.

    Args:
        block: iterations per block.
        first_on: whether the first block (iterations ``0 .. block - 1``) runs the feature.
    """

    block: int
    """Iterations per block."""

    first_on: bool = True
    """Whether the block holding iteration 0 runs the feature."""

    gain: float | None = None
    """Always None: an alternation measures nothing itself (the benchmark reads the times)."""

    def __post_init__(self) -> None:
        if self.block < 1:
            raise ValueError(f"an alternation's block must be >= 1 iteration, got {self.block}")

    def enabled(self, iteration: int) -> bool:
        """Whether the feature runs for ``iteration``."""
        return ((iteration // self.block) % 2 == 0) == self.first_on

    def probing(self, iteration: int) -> bool:
        """Every iteration is part of the comparison."""
        return True

    def record(self, iteration: int, measured_s: float, work: float) -> None:
        """Nothing to decide."""

    def state_dict(self) -> dict[str, Any]:
        """The pattern depends on the iteration alone: nothing to carry across a resume."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""
