# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's outputs: a Chrome/Perfetto trace, a PNG timeline and a text summary.

The trace is Chrome's Trace Event Format (a JSON object with ``traceEvents``; complete events
``"ph": "X"`` with microsecond ``ts``/``dur``; one process per pipeline rank), which
``chrome://tracing`` and ``ui.perfetto.dev`` open. The PNG needs matplotlib, an optional
dependency (``pip install 'orchweave[plots]'``); everything else works without it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from pipeweaver.ir import MODULE_INDEX
from pipeweaver.semu.results import Event, StepPrediction

MODULE_COLORS = {"vision": "#1f77b4", "audio": "#2ca02c", "llm": "#ff7f0e"}
"""Base colour of each module; forwards are drawn lighter, backwards darker."""

OTHER_COLORS = {
    "allreduce": "#7f7f7f", "optimizer": "#9467bd", "host": "#d9d9d9", "a2a": "#8c564b",
    "p2p": "#e377c2", "allgather": "#17becf", "reducescatter": "#bcbd22",
}  # fmt: skip

COMM_STREAM = ("allgather", "reducescatter")
"""Categories on a rank's communication stream, drawn beside its compute (they overlap it)."""


def _shade(hex_color: str, factor: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    if factor >= 1:  # towards white
        f = factor - 1
        r, g, b = (int(c + (255 - c) * f) for c in (r, g, b))
    else:  # towards black
        r, g, b = (int(c * factor) for c in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"


def event_color(e: Event) -> str:
    """Colour of an event: module hue, light for F, dark for B; fixed colours otherwise."""
    if e.category == "F+B":  # a plan's load of a phase, forward and backward together
        return MODULE_COLORS.get(e.module, "#17becf")
    if e.category in ("F", "B"):
        base = MODULE_COLORS.get(e.module, "#17becf")
        return _shade(base, 1.45) if e.category == "F" else _shade(base, 0.75)
    return OTHER_COLORS.get(e.category, "#bcbd22")


def chrome_trace(result: StepPrediction, name: str = "semu") -> dict[str, Any]:
    """The step's timeline as a Chrome trace object."""
    events: list[dict[str, Any]] = []
    ranks = sorted({e.rank for e in result.events})
    for r in ranks:
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": r,
                "tid": 0,
                "args": {"name": f"pipeline rank {r}"},
            }
        )
        events.append(
            {"name": "thread_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": "compute"}}
        )
        if any(e.rank == r and e.category in COMM_STREAM for e in result.events):
            events.append(
                {"name": "thread_name", "ph": "M", "pid": r, "tid": 1,
                 "args": {"name": "DP communication"}}
            )  # fmt: skip
    for e in result.events:
        events.append(
            {
                "name": e.name,
                "cat": e.category if not e.module else f"{e.module},{e.category}",
                "ph": "X",
                "ts": e.start * 1e6,
                "dur": max(e.end - e.start, 0.0) * 1e6,
                "pid": e.rank,
                "tid": 1 if e.category in COMM_STREAM else 0,
                "args": {"module": e.module, "microbatch": e.microbatch},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "name": name,
            "step_time_s": result.step_time_s,
            "bubble_ratio": result.bubble_ratio,
            "mfu": result.mfu,
        },
    }


def write_chrome_trace(result: StepPrediction, path: str | os.PathLike, name: str = "semu") -> None:
    """Write :func:`chrome_trace` as JSON."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(result, name), f)


def pyplot():
    """matplotlib's ``pyplot`` and ``Patch``, drawing to files only (the Agg backend).

    Raises:
        ImportError: matplotlib is not installed; the message says how to install it.
    """
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "drawing a PNG timeline needs matplotlib, an optional dependency of OrchWeave: "
            "pip install 'orchweave[plots]'"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    return plt, Patch


def write_png(
    result: StepPrediction, path: str | os.PathLike, title: str = "", max_ranks: int = 64
) -> None:
    """Draw the timeline: one row per pipeline rank, coloured by module and by F/B.

    Raises:
        ImportError: matplotlib is not installed (``pip install 'orchweave[plots]'``).
    """
    plt, Patch = pyplot()

    ranks = sorted({e.rank for e in result.events})[:max_ranks]
    fig_h = 1.6 + 0.5 * len(ranks)
    fig, ax = plt.subplots(figsize=(14, fig_h))
    for row, r in enumerate(ranks):
        evs = [e for e in result.events if e.rank == r]
        # The communication stream's ops in a thin band under the rank's compute.
        for band, keep in (((row - 0.4, 0.6), False), ((row + 0.22, 0.18), True)):
            sel = [e for e in evs if (e.category in COMM_STREAM) == keep]
            if not keep and not any(e.category in COMM_STREAM for e in evs):
                band = (row - 0.4, 0.8)
            ax.broken_barh(
                [(e.start * 1e3, (e.end - e.start) * 1e3) for e in sel],
                band,
                facecolors=[event_color(e) for e in sel],
                edgecolor="white",
                linewidth=0.2,
            )
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, result.step_time_s * 1e3 * 1.01)
    modules = sorted({e.module for e in result.events if e.module}, key=MODULE_INDEX.__getitem__)
    handles = []
    for m in modules:
        handles.append(Patch(color=_shade(MODULE_COLORS[m], 1.45), label=f"{m} F"))
        handles.append(Patch(color=_shade(MODULE_COLORS[m], 0.75), label=f"{m} B"))
    for cat in sorted({e.category for e in result.events} & set(OTHER_COLORS)):
        handles.append(Patch(color=OTHER_COLORS[cat], label=cat))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    ax.set_title(
        title
        or f"step {result.step_time_s * 1e3:.1f} ms, bubble {result.bubble_ratio:.1%}, "
        f"MFU {result.mfu:.1%}"
    )
    fig.tight_layout(rect=(0, 0.35 / fig_h, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bytes(x: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.1f} {unit}"
        x /= 1024
    return f"{x:.1f} TiB"


def summary(result: StepPrediction, header: Sequence[str] = ()) -> str:
    """A readable report of one simulated step."""
    lines = list(header)
    lines.append(
        f"step time {result.step_time_s * 1e3:.3f} ms | bubble {result.bubble_ratio:.2%} | "
        f"MFU {result.mfu:.2%} | {result.num_devices} devices | "
        f"model {result.model_flops / 1e12:.3f} TFLOP per step"
    )
    b = result.breakdown
    lines.append(
        "critical path: "
        + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in b.items())
        + f" (slowest DP replica: {result.critical_replica})"
    )
    lines.append(
        f"{'rank':>4} {'busy ms':>10} {'idle ms':>10} {'weights':>11} {'grads':>11} "
        f"{'optimizer':>11} {'activations':>12} {'peak memory':>12}"
    )
    for r, s in enumerate(result.static_bytes):
        lines.append(
            f"{r:>4} {result.busy_s[r] * 1e3:>10.3f} {result.idle_s[r] * 1e3:>10.3f} "
            f"{_bytes(s['weights']):>11} {_bytes(s['gradients']):>11} "
            f"{_bytes(s['optimizer']):>11} {_bytes(result.peak_activation_bytes[r]):>12} "
            f"{_bytes(result.peak_memory_bytes[r]):>12}"
        )
    if result.over_memory_ranks:
        lines.append(
            f"WARNING: ranks {result.over_memory_ranks} exceed the device memory of "
            f"{_bytes(result.device_memory_bytes)} (try --memory recompute)"
        )
    if result.reuse:
        parts = [
            f"{lvl} {v['hit_rate']:.1%} of {int(v['hits'] + v['misses'])}"
            for lvl, v in result.reuse.items()
        ]
        lines.append("reuse hit rates: " + ", ".join(parts))
    return "\n".join(lines)
