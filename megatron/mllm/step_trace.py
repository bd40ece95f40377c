# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A real step's timeline beside SEMU's prediction of it: the Chrome trace and the PNG.

Inputs are what :class:`megatron.mllm.profiling.StepProfiler` collected in the profiled
iterations: every rank's timer spans (:class:`ProfiledIteration`, on that rank's clock), the
clock offsets between ranks, optionally ``torch.profiler``'s events, and the prediction of each
iteration (:class:`PredictedIteration`). Times are put on rank 0's clock by subtracting each
rank's offset, then counted from the first profiled iteration's start.

The trace is Chrome's Trace Event Format (``chrome://tracing``, ``ui.perfetto.dev``): one process
per rank with the measured spans (nested as the timers were, thread 0) and, when recorded,
``torch.profiler``'s CPU and CUDA events (further threads); then one process per predicted rank,
sorted after the measured ones, with the prediction of the same iterations placed at the
measured iterations' starts.

Pure Python: the collecting and gathering are :mod:`megatron.mllm.profiling`'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from megatron.mllm.prediction import PredictedIteration
from megatron.mllm.timers import BACKWARD_TIMERS, FORWARD_TIMERS, Span
from pipeweaver.ir import Compute, ScheduleError, parse
from pipeweaver.semu.results import Event
from pipeweaver.semu.trace import event_color, pyplot

COMMUNICATION = {
    "recv-wait": "p2p", "recv-post": "p2p", "send-post": "p2p", "send-drain": "p2p",
    "all-to-all": "a2a", "metadata-gather": "allreduce", "all-grads-sync": "allreduce",
    "loss-reduce": "allreduce",
}  # fmt: skip
"""Timer name -> category of the spans that move data (drawn as communication, not busy)."""

PREDICTED_PID = 10_000
"""Process ids of the prediction's tracks start here (after any rank's)."""


@dataclass
class ProfiledIteration:
    """One rank's record of one profiled iteration."""

    iteration: int
    """The iteration (1-based, as the log counts)."""

    start: float
    """When it started, seconds on this rank's clock."""

    seconds: float
    """Its duration, as the trainer measured it."""

    spans: list[Span]
    """Every timer span of it (level 2)."""

    actions: list[str] | None = None
    """The pipeline runtime's action list of this rank, in schedule order, if it ran one."""

    torch_events: list[dict] = field(default_factory=list)
    """``torch.profiler``'s complete events of it (``ts`` in microseconds on this rank's clock),
    on the ranks of ``--profile-ranks`` with ``--use-pytorch-profiler``."""


def category(name: str) -> str:
    """The drawing category of a timer: ``F``, ``B``, ``p2p``, ``a2a``, ``allreduce``,
    ``optimizer`` or ``host``."""
    if name in FORWARD_TIMERS:
        return "F"
    if name in BACKWARD_TIMERS:
        return "B"
    if name in COMMUNICATION:
        return COMMUNICATION[name]
    if name.startswith("optimizer"):
        return "optimizer"
    return "host"


def _module_of(span: Span) -> tuple[str, int]:
    """The module and microbatch of a compute span (from its action or encoder name)."""
    if span.detail is None:
        return "llm", -1
    try:
        action = parse(span.detail)
    except (ScheduleError, ValueError, KeyError):
        return span.detail, -1  # an encoder phase of the per-phase balanced step
    if isinstance(action, Compute):
        return action.module, action.microbatch
    return "", -1


def span_events(spans: Iterable[Span], rank: int, shift: float) -> list[Event]:
    """Spans as timeline events (outer spans first, so inner ones draw over them).

    Args:
        spans: one rank's spans.
        rank: the track.
        shift: subtracted from every time (the rank's clock offset plus the trace's zero).
    """
    events = []
    for s in sorted(spans, key=lambda s: (s.depth, s.start)):
        cat = category(s.name)
        module, mb = _module_of(s) if cat in ("F", "B") else ("", -1)
        name = s.name if s.detail is None else f"{s.name} {s.detail}"
        events.append(Event(rank, s.start - shift, s.end - shift, name, cat, module, mb))
    return events


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def busy_seconds(events: Iterable[Event]) -> float:
    """Compute time of one track: the union of its F and B intervals, less the communication
    inside them (an encoder's backward span holds the backward all-to-all)."""
    events = list(events)
    compute = _union((e.start, e.end) for e in events if e.category in ("F", "B"))
    comm = _union((e.start, e.end) for e in events if e.category in ("p2p", "a2a", "allreduce"))
    overlap = 0.0
    for a, b in compute:
        for c, d in comm:
            overlap += max(0.0, min(b, d) - max(a, c))
    return _length(compute) - overlap


# --------------------------------------------------------------------------------------------
# The Chrome trace


def _meta(pid: int, tid: int, kind: str, value) -> dict:
    key = "sort_index" if kind.endswith("sort_index") else "name"
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _complete(name: str, cat: str, ts_s: float, dur_s: float, pid: int, tid: int,
              args: Mapping | None = None) -> dict:  # fmt: skip
    event = {"name": name, "cat": cat, "ph": "X", "ts": ts_s * 1e6,
             "dur": max(dur_s, 0.0) * 1e6, "pid": pid, "tid": tid}  # fmt: skip
    if args:
        event["args"] = dict(args)
    return event


def profile_trace(
    measured: Sequence[Sequence[ProfiledIteration]],
    offsets: Sequence[float],
    predicted: Sequence[PredictedIteration],
) -> dict[str, Any]:
    """The Chrome trace of the profiled iterations.

    Args:
        measured: per global rank, its profiled iterations.
        offsets: each rank's clock minus rank 0's, seconds.
        predicted: the prediction of each profiled iteration (may be empty).
    """
    zero = min(it.start - offsets[r] for r, its in enumerate(measured) for it in its)
    events: list[dict] = []
    starts: dict[int, dict[int, float]] = {}
    summary = {"iterations": [], "measured_s": {}, "predicted_step_s": {}, "actions": {}}
    for r, its in enumerate(measured):
        shift = offsets[r] + zero
        events += [_meta(r, 0, "process_name", f"rank {r}: measured"),
                   _meta(r, 0, "process_sort_index", r),
                   _meta(r, 0, "thread_name", "OrchWeave timers")]  # fmt: skip
        torch_tids: dict[Any, int] = {}
        for it in its:
            starts.setdefault(it.iteration, {})[r] = it.start - shift
            summary["measured_s"].setdefault(str(it.iteration), []).append(it.seconds)
            if it.actions is not None:
                summary["actions"].setdefault(str(it.iteration), {})[str(r)] = it.actions
            events.append(_complete(f"iteration {it.iteration}", "iteration",
                                    it.start - shift, it.seconds, r, 0))  # fmt: skip
            for s in sorted(it.spans, key=lambda s: (s.start, s.depth)):
                args = {"level": s.level}
                if s.detail is not None:
                    args["action" if category(s.name) in ("F", "B") else "detail"] = s.detail
                if s.group is not None:
                    args["group"] = list(s.group)
                name = s.name if s.detail is None else f"{s.name} {s.detail}"
                events.append(_complete(name, s.name, s.start - shift, s.seconds, r, 0, args))
            for e in it.torch_events:
                tid = torch_tids.setdefault(e.get("tid"), len(torch_tids) + 1)
                events.append({**e, "pid": r, "tid": tid, "ts": e["ts"] - shift * 1e6})
        for orig, tid in torch_tids.items():
            events.append(_meta(r, tid, "thread_name", f"torch.profiler {orig}"))
    summary["iterations"] = sorted(starts)
    for p in predicted:
        at = min(starts.get(p.iteration, {0: 0.0}).values())
        summary["predicted_step_s"][str(p.iteration)] = p.step_s
        for i, rank in enumerate(p.ranks):
            pid = PREDICTED_PID + rank
            events += [_meta(pid, 0, "process_name", f"rank {rank}: predicted ({p.source})"),
                       _meta(pid, 0, "process_sort_index", PREDICTED_PID + rank),
                       _meta(pid, 0, "thread_name", "prediction")]  # fmt: skip
        for e in p.events:
            args = {"module": e.module, "microbatch": e.microbatch}
            events.append(_complete(e.name, f"predicted,{e.category}", at + e.start,
                                    e.end - e.start, PREDICTED_PID + p.ranks[e.rank], 0,
                                    args))  # fmt: skip
    # One metadata record per process and thread is enough.
    unique = list({repr(e) if e["ph"] == "M" else id(e): e for e in events}.values())
    return {"traceEvents": unique, "displayTimeUnit": "ms", "otherData": summary}


# --------------------------------------------------------------------------------------------
# The PNG and its summary


def comparison(
    measured: Sequence[Sequence[ProfiledIteration]], offsets: Sequence[float], iteration: int
) -> tuple[list[Event], list[float], float]:
    """One iteration's measured events (seconds from its start on rank 0's clock), each rank's
    measured busy seconds, and the iteration time (the slowest rank's)."""
    events: list[Event] = []
    busy: list[float] = []
    its = [next(it for it in rank_its if it.iteration == iteration) for rank_its in measured]
    zero = min(it.start - offsets[r] for r, it in enumerate(its))
    for r, it in enumerate(its):
        mine = span_events(it.spans, r, offsets[r] + zero)
        busy.append(busy_seconds(mine))
        events += mine
    end = max(it.start - offsets[r] - zero + it.seconds for r, it in enumerate(its))
    return events, busy, end


def drawn_in_seconds(
    predicted: PredictedIteration, measured_busy: Sequence[float]
) -> PredictedIteration:
    """A prediction in seconds as it is: one in FLOPs (the plan of the FLOP cost model) drawn at
    the rate the ranks measured (their busy seconds over the predicted FLOPs, all ranks), which
    keeps the predicted balance between ranks and phases."""
    if predicted.unit == "seconds" or not sum(predicted.busy_s):
        return predicted
    rate = sum(measured_busy) / sum(predicted.busy_s)  # seconds per FLOP
    events = [replace(e, start=e.start * rate, end=e.end * rate) for e in predicted.events]
    return replace(predicted, events=events, busy_s=[b * rate for b in predicted.busy_s],
                   unit="seconds", source=f"{predicted.source}, FLOPs at {1 / rate / 1e9:.2f} "
                   f"GFLOP/s measured")  # fmt: skip


def summary_lines(iteration: int, measured_s: float, busy: Sequence[float],
                  predicted: PredictedIteration | None) -> list[str]:  # fmt: skip
    """Predicted beside measured: the step time and each rank's busy time."""
    lines = [f"iteration {iteration}: measured step {measured_s * 1e3:.1f} ms"]
    if predicted is not None and predicted.step_s is not None:
        lines[0] += (
            f", predicted {predicted.step_s * 1e3:.1f} ms ({predicted.source}, "
            f"{predicted.step_s / measured_s:.2f}x the measured)"
        )
    elif predicted is not None:
        lines[0] += f"; the prediction ({predicted.source}) is of compute only"
    for r, b in enumerate(busy):
        line = f"  rank {r}: busy measured {b * 1e3:.1f} ms"
        if predicted is not None and r in predicted.ranks:
            value = predicted.busy_s[predicted.ranks.index(r)]
            line += ", predicted " + (
                f"{value * 1e3:.1f} ms" if predicted.unit == "seconds" else f"{value:.3g} FLOPs"
            )
        lines.append(line)
    return lines


def _draw(ax, events: Sequence[Event], rows: Mapping[int, int]) -> None:
    for e in events:
        if e.rank not in rows:
            continue
        row = rows[e.rank]
        # Outer spans are drawn thinner, so the compute and waits inside them stand out.
        height = 0.8 if e.category != "host" else 0.5
        ax.broken_barh([(e.start * 1e3, (e.end - e.start) * 1e3)], (row - height / 2, height),
                       facecolors=event_color(e), edgecolor="none")  # fmt: skip


def write_comparison_png(path: str | os.PathLike, measured: Sequence[Event],
                         predicted: PredictedIteration | None, world: int,
                         lines: Sequence[str]) -> None:  # fmt: skip
    """Measured timeline above predicted, on one time axis (ms from the step's start).

    Raises:
        ImportError: matplotlib is not installed (``pip install 'orchweave[plots]'``).
    """
    plt, Patch = pyplot()
    panels = 2 if predicted is not None else 1
    height = 1.5 + 0.45 * world * panels + 0.18 * len(lines)
    fig, axes = plt.subplots(panels, 1, figsize=(14, height), sharex=True, squeeze=False)
    rows = {r: r for r in range(world)}
    _draw(axes[0][0], measured, rows)
    axes[0][0].set_title("measured", loc="left", fontsize=9)
    ends = [e.end for e in measured]
    if predicted is not None:
        pred_events = [
            Event(predicted.ranks[e.rank], e.start, e.end, e.name, e.category, e.module)
            for e in predicted.events
        ]
        _draw(axes[1][0], pred_events, rows)
        axes[1][0].set_title(f"predicted ({predicted.source})", loc="left", fontsize=9)
        ends += [e.end for e in pred_events]
    for (ax,) in axes:
        ax.set_yticks(range(world))
        ax.set_yticklabels([f"rank {r}" for r in range(world)])
        ax.set_ylim(world - 0.5, -0.5)
    axes[-1][0].set_xlabel("time from the step's start (ms)")
    axes[-1][0].set_xlim(0, max(ends) * 1e3 * 1.01)
    seen = {
        (e.category, e.module): e for e in [*measured, *(predicted.events if predicted else [])]
    }
    handles = [Patch(color=event_color(e), label=f"{m} {c}".strip())
               for (c, m), e in sorted(seen.items())]  # fmt: skip
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=8,
               frameon=False)  # fmt: skip
    fig.suptitle("\n".join(lines), fontsize=8, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.5 / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
