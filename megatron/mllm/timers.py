# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Per-rank step timers with Megatron's flags: ``--timing-log-level`` and ``--timing-log-option``.

Level 0 records nothing (no clock call, no collective, no synchronisation); level 1 times what
runs about once per iteration (loading, the step, each exchange, gradient reduction, the
optimizer); level 2 also what runs many times (every compute action, every posted send and
receive and every wait of the pipeline runtime, every LLM microbatch). As in Megatron, a timer
is ``timers(name, log_level).start()`` / ``.stop()``: :class:`StepTimers` is what
megatron-core's own schedules, ``finalize_model_grads`` and optimizer see as ``config.timers``,
so their timers (``forward-compute``, ``all-grads-sync``, ``optimizer-inner-step``, ...) land
here too. OrchWeave's code uses :meth:`StepTimers.span`, which also names the action
(``detail``) and, for a collective, the ranks that take part (``group``).

Each recorded :class:`Span` keeps its nesting depth: the spans at depth 0 partition an
iteration (``batch-generator``, ``forward-backward``, ``optimizer``, ``loss-reduce``), what they
leave out is reported as ``other``. A timer started again while it runs (megatron-core starts
``forward-backward`` inside the trainer's) counts once.

Collectives are timed without a barrier: each rank records when it arrived and when the call
returned. Once every rank's spans are gathered (:func:`collective_waits`), the last arrival of a
group splits each rank's time into the *wait* for the slowest rank and the *transfer* after it.
Clocks of different ranks are aligned by the offsets :func:`megatron.mllm.distributed.clock_offsets`
estimated at start-up (on one host they are about zero).

Pure Python: the gathering itself is ``megatron.mllm.distributed``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from pipeweaver.ir import LETTER_MODULE as MODULE_OF_LETTER

OTHER = "other"
"""The part of an iteration no depth-0 timer covers."""

LOG_OPTIONS = ("max", "minmax", "all")
"""``--timing-log-option`` values (Megatron's)."""

FORWARD_TIMERS = ("forward-compute", "encoder-forward")
"""Timers of forward compute: megatron-core's and the runtime's per microbatch or action, and
the per-phase step's encoder bodies."""

BACKWARD_TIMERS = ("backward-compute", "encoder-backward")
"""Timers of backward compute (an encoder's backward holds the transposed exchange)."""

PIPELINE_WAIT_TIMERS = ("recv-wait", "send-drain")
"""Timers of the pipeline runtime waiting for its peers."""


@dataclass(frozen=True, slots=True)
class Span:
    """One timed interval on one rank."""

    name: str
    """Timer name (``forward-compute``, ``all-to-all``, ...)."""

    level: int
    """Its timing level (1 or 2)."""

    start: float
    """Start, seconds on this rank's clock."""

    end: float
    """End, seconds on this rank's clock."""

    depth: int
    """Timers open around it (0: it partitions the iteration)."""

    detail: str | None = None
    """What it timed: the action (``v1F3.0``), the exchange (``vision inputs``)."""

    group: tuple[int, ...] | None = None
    """For a collective, the global ranks that take part."""

    @property
    def seconds(self) -> float:
        """Its duration."""
        return self.end - self.start


class _NullTimer:
    """A timer below the timing level: records nothing."""

    __slots__ = ()

    def start(self, barrier: bool = False) -> None:
        return None

    def stop(self, barrier: bool = False) -> None:
        return None

    def __enter__(self) -> "_NullTimer":
        return self

    def __exit__(self, *exc) -> None:
        return None


_NULL = _NullTimer()


class _Timer:
    """One named timer (megatron-core's protocol; also a context manager)."""

    __slots__ = ("owner", "name", "level", "detail", "group", "_start", "_depth", "_open",
                 "_shadow")  # fmt: skip

    def __init__(self, owner: "StepTimers", name: str, level: int, detail=None, group=None):
        self.owner = owner
        self.name = name
        self.level = level
        self.detail = detail
        self.group = group
        self._open = 0
        self._shadow = False

    def start(self, barrier: bool = False) -> None:
        """Start (``barrier`` is ignored: collectives are timed from each rank's arrival)."""
        self._open += 1
        if self._open > 1:
            return
        # A timer of the same name already runs (megatron-core's ``forward-backward`` inside
        # the trainer's): the outer one counts, this one shadows it.
        self._shadow = self.name in self.owner._active
        if self._shadow:
            return
        self.owner._active.add(self.name)
        self._depth = self.owner._push()
        self._start = self.owner._now()

    def stop(self, barrier: bool = False) -> None:
        """Stop; the outermost stop records the span."""
        if self._open == 0:
            return
        self._open -= 1
        if self._open or self._shadow:
            return
        end = self.owner._now()
        self.owner._pop()
        self.owner._active.discard(self.name)
        self.owner.spans.append(
            Span(self.name, self.level, self._start, end, self._depth, self.detail, self.group)
        )

    def __enter__(self) -> "_Timer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class StepTimers:
    """This rank's timers of one run (see the module docstring)."""

    def __init__(self, level: int = 0, option: str = "minmax",
                 sync: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 groups: Mapping[str, Sequence[int]] | None = None):  # fmt: skip
        """Args:
        level: ``--timing-log-level``: 0, 1 or 2.
        option: ``--timing-log-option``: ``max``, ``minmax`` or ``all``.
        sync: called at every start and stop (``torch.cuda.synchronize`` on GPUs, so that a
            span ends when the device is done); None on CPU.
        clock: seconds (``time.perf_counter``: on Linux one monotonic clock per host).
        groups: the ranks of the collective that a timer of megatron-core's protocol times
            (``all-grads-sync``: the DP group), so that its wait is split off too.
        """
        if level not in (0, 1, 2):
            raise ValueError(f"--timing-log-level must be 0, 1 or 2, got {level}")
        if option not in LOG_OPTIONS:
            raise ValueError(f"--timing-log-option must be one of {LOG_OPTIONS}, got {option!r}")
        self.level = level
        self.option = option
        self.sync = sync
        self.clock = clock
        self.groups = {name: tuple(ranks) for name, ranks in (groups or {}).items()}
        self.spans: list[Span] = []
        """Spans recorded since the last :meth:`take`."""
        self._timers: dict[str, _Timer] = {}
        self._active: set[str] = set()
        self._depth = 0

    def enabled(self, level: int = 1) -> bool:
        """Whether timers of ``level`` record."""
        return 0 < level <= self.level

    def __call__(self, name: str, log_level: int | None = None):
        """megatron-core's protocol: the timer ``name``, created at ``log_level``; a name first
        seen without one is created at level 2, as Megatron's ``Timers`` does (megatron-core
        stops ``forward-compute`` without a level)."""
        timer = self._timers.get(name)
        if timer is None:
            level = 2 if log_level is None else log_level
            if not self.enabled(level):
                return _NULL
            timer = self._timers[name] = _Timer(self, name, level, group=self.groups.get(name))
        elif not self.enabled(timer.level) and not timer._open:
            # The level was lowered (a profiled window ended): record nothing again.
            return _NULL
        return timer

    def span(self, name: str, level: int = 1, detail: str | None = None,
             group: Sequence[int] | None = None):  # fmt: skip
        """A context manager timing one span (a fresh timer: details differ per call)."""
        if not self.enabled(level):
            return _NULL
        return _Timer(self, name, level, detail, None if group is None else tuple(group))

    def take(self) -> list[Span]:
        """The spans recorded since the last call, which starts afresh."""
        spans, self.spans = self.spans, []
        return spans

    def _now(self) -> float:
        if self.sync is not None:
            self.sync()
        return self.clock()

    def _push(self) -> int:
        self._depth += 1
        return self._depth - 1

    def _pop(self) -> None:
        self._depth -= 1


NULL_TIMERS = StepTimers(0)
"""Timers that record nothing (components built without a run's timers use it)."""


# --------------------------------------------------------------------------------------------
# One iteration, all ranks


def seconds_by_name(spans: Iterable[Span]) -> dict[str, float]:
    """Total seconds of each timer name."""
    out: dict[str, float] = {}
    for s in spans:
        out[s.name] = out.get(s.name, 0.0) + s.seconds
    return out


def exclusive_seconds(spans: Iterable[Span]) -> dict[str, float]:
    """Seconds of each timer name not inside another span (its self time): with :data:`OTHER`
    they add up to the iteration."""
    spans = sorted(spans, key=lambda s: (s.start, s.depth))
    out = seconds_by_name(spans)
    for i, parent in enumerate(spans):
        for child in spans[i + 1 :]:
            if child.start >= parent.end:
                break
            if child.depth == parent.depth + 1:
                out[parent.name] -= child.seconds
    return out


def detail_key(span: Span) -> str | None:
    """What a span's time is summed under besides its name: the module of a compute action
    (``v1F3.0`` -> ``vision``), the detail of a once-per-iteration span (an encoder, an
    exchange); None for the many small ones (each send and receive)."""
    if span.detail is None:
        return None
    if span.level == 1:
        return span.detail
    if span.name in (FORWARD_TIMERS[0], BACKWARD_TIMERS[0]):  # the runtime's actions
        return MODULE_OF_LETTER.get(span.detail[:1])
    return None


def seconds_by_detail(spans: Iterable[Span]) -> dict[str, dict[str, float]]:
    """Per timer name, seconds per :func:`detail_key`."""
    out: dict[str, dict[str, float]] = {}
    for s in spans:
        key = detail_key(s)
        if key is not None:
            per = out.setdefault(s.name, {})
            per[key] = per.get(key, 0.0) + s.seconds
    return out


def partition(spans: Iterable[Span], iteration_s: float) -> dict[str, float]:
    """The depth-0 timers of an iteration and what they leave out (:data:`OTHER`)."""
    top = seconds_by_name(s for s in spans if s.depth == 0)
    top[OTHER] = iteration_s - sum(top.values())
    return top


@dataclass
class RankTimes:
    """What one rank reports of one iteration (the payload of the timers' all-gather)."""

    iteration_s: float
    """The iteration, as the trainer measured it."""

    seconds: dict[str, float]
    """Total seconds per timer name."""

    top: dict[str, float]
    """The depth-0 partition, with :data:`OTHER`."""

    depth: dict[str, int] = field(default_factory=dict)
    """The least nesting depth of each timer name (for indenting the log)."""

    collectives: list[Span] = field(default_factory=list)
    """Spans of collectives (with their group), for the waits."""

    exclusive: dict[str, float] = field(default_factory=dict)
    """Self seconds per timer name (:func:`exclusive_seconds`)."""

    detail: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per timer name, seconds per module, encoder or exchange (:func:`seconds_by_detail`)."""

    count: int = 0
    """Spans recorded (what the timers cost scales with)."""

    @classmethod
    def of(cls, spans: list[Span], iteration_s: float) -> "RankTimes":
        """Summarise one rank's spans of one iteration."""
        spans = sorted(spans, key=lambda s: s.start)
        depth: dict[str, int] = {}
        for s in spans:
            depth[s.name] = min(depth.get(s.name, s.depth), s.depth)
        return cls(
            iteration_s,
            seconds_by_name(spans),
            partition(spans, iteration_s),
            depth,
            [s for s in spans if s.group is not None],
            exclusive_seconds(spans),
            seconds_by_detail(spans),
            len(spans),
        )


def collective_waits(
    ranks: Sequence[RankTimes], offsets: Sequence[float]
) -> dict[str, dict[str, list[float]]]:
    """Per collective name, each rank's seconds waiting for the group's last arrival and
    transferring after it (summed over the iteration's calls of that name).

    Calls are matched by (name, detail, group, occurrence): every member of a group makes the
    same calls in the same order.

    Args:
        ranks: every global rank's times, in rank order.
        offsets: each rank's clock minus rank 0's (seconds).
    """
    calls: dict[tuple, dict[int, Span]] = {}
    for r, times in enumerate(ranks):
        seen: dict[tuple, int] = {}
        for s in times.collectives:
            key = (s.name, s.detail, s.group)
            n = seen.get(key, 0)
            seen[key] = n + 1
            calls.setdefault((*key, n), {})[r] = s
    world = len(ranks)
    out: dict[str, dict[str, list[float]]] = {}
    for (name, _, group, _), by_rank in calls.items():
        entry = out.setdefault(name, {"wait": [0.0] * world, "transfer": [0.0] * world})
        last = max(s.start - offsets[r] for r, s in by_rank.items())
        for r, s in by_rank.items():
            start, end = s.start - offsets[r], s.end - offsets[r]
            wait = min(max(0.0, last - start), end - start)
            entry["wait"][r] += wait
            entry["transfer"][r] += (end - start) - wait
    return out


def iteration_record(ranks: Sequence[RankTimes], offsets: Sequence[float]) -> dict:
    """The ``timers`` entry of one iteration's metrics: every rank's seconds per timer (in rank
    order), their self seconds, the seconds per module, encoder or exchange, the depth-0
    partition, and the collectives' waits."""
    # Names in the order they first start, rank by rank: the log reads like the step.
    names = list(dict.fromkeys(n for r in ranks for n in r.seconds))
    tops = list(dict.fromkeys(n for r in ranks for n in r.top))
    details: dict[str, list[str]] = {}
    for r in ranks:
        for n, per in r.detail.items():
            details.setdefault(n, [])
            details[n] += [k for k in per if k not in details[n]]
    return {
        "seconds": {n: [r.seconds.get(n, 0.0) for r in ranks] for n in names},
        "exclusive": {n: [r.exclusive.get(n, 0.0) for r in ranks] for n in names},
        "detail": {
            n: {k: [r.detail.get(n, {}).get(k, 0.0) for r in ranks] for k in keys}
            for n, keys in details.items()
        },
        "depth": {n: min(r.depth.get(n, 99) for r in ranks) for n in names},
        "partition": {n: [r.top.get(n, 0.0) for r in ranks] for n in tops},
        "iteration_s": [r.iteration_s for r in ranks],
        "spans": [r.count for r in ranks],
        "collectives": collective_waits(ranks, offsets),
    }


# --------------------------------------------------------------------------------------------
# The log


class TimerLog:
    """Accumulates iterations' timer records between two log lines; formats them as Megatron."""

    def __init__(self, option: str):
        self.option = option
        self._sums: dict[str, list[float]] = {}
        self._order: list[str] = []
        self._depth: dict[str, int] = {OTHER: 0}
        self._iterations = 0

    def add(self, record: Mapping) -> None:
        """One iteration's :func:`iteration_record`."""
        self._iterations += 1
        rows = dict(record["seconds"])
        rows[OTHER] = record["partition"].get(OTHER, [])
        for name, d in record.get("depth", {}).items():
            self._depth[name] = min(self._depth.get(name, d), d)
        for name, per_rank in rows.items():
            if name not in self._sums:
                self._sums[name] = [0.0] * len(per_rank)
                self._order.append(name)
            for r, v in enumerate(per_rank):
                self._sums[name][r] += v

    def format(self) -> str:
        """The lines Megatron prints after the iteration line, averaged per iteration."""
        n = max(1, self._iterations)
        names = sorted(self._order, key=lambda x: x == OTHER)  # stable: the step's order
        if self.option == "all":
            lines = ["times across ranks (ms):"]
            for name in names:
                lines.append(f"  {name}:")
                lines += [
                    f"     rank {r:2d}: {v / n * 1e3:.2f}" for r, v in enumerate(self._sums[name])
                ]
            return "\n".join(lines)
        title = "max time across ranks (ms):" if self.option == "max" else (
            "(min, max) time across ranks (ms):")  # fmt: skip
        lines = [title]
        for name in names:
            values = [v / n * 1e3 for v in self._sums[name]]
            label = "  " * self._depth.get(name, 0) + name
            dots = "." * max(1, 48 - len(label))
            if self.option == "max":
                lines.append(f"    {label} {dots}: {max(values):.2f}")
            else:
                lines.append(f"    {label} {dots}: ({min(values):.2f}, {max(values):.2f})")
        return "\n".join(lines)
