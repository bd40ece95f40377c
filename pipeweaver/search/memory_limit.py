# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The activation memory each pipeline rank may use: the limit of phases 2 and 3.

A device holds the rank's static bytes (parameters, gradients and optimizer states, as the
optimizer shards them: :meth:`pipeweaver.semu.simulator.Semu.static_bytes`) and the
activations its forwards keep for their backwards. The limit on the latter is the device's
memory (or ``--pipeline-memory-limit-gb``, total per device, when given) minus the static bytes.
A CPU run without the flag has no limit: host memory is not the pipeline's to plan.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pipeweaver.ir import ScheduleError

GIB = float(1 << 30)
"""Bytes in one GiB (the flag's unit)."""

MEMORY_LIMIT_FLAG = "--pipeline-memory-limit-gb"
"""The flag that sets the total memory of each device (GiB)."""

STATIC_PARTS = ("weights", "gradients", "optimizer")
"""The parts of :meth:`~pipeweaver.semu.simulator.Semu.static_bytes` resident on the device."""


def static_total(static: float | Mapping[str, float]) -> float:
    """The resident bytes of one rank: a number, or one entry of ``Semu.static_bytes``."""
    if isinstance(static, Mapping):
        return float(sum(static[k] for k in STATIC_PARTS))
    return float(static)


def headroom_limit_gb(
    fraction: float,
    static_bytes_per_rank: Sequence[float | Mapping[str, float]],
    peak_activation_bytes: Sequence[float],
) -> float:
    """A ``--pipeline-memory-limit-gb`` (GiB per device) that leaves ``fraction`` of a step's
    peak activations (the busiest rank's) above the largest static bytes: a limit that makes
    the search recompute, for tests and benchmarks of the memory plan.

    Args:
        fraction: share of the peak activations left under the limit.
        static_bytes_per_rank: numbers, or the dicts of ``Semu.static_bytes``.
        peak_activation_bytes: per rank, e.g. ``StepPrediction.peak_activation_bytes``.
    """
    static = max(static_total(s) for s in static_bytes_per_rank)
    return (static + fraction * max(peak_activation_bytes)) / GIB


def memory_limit_bytes(
    device_bytes: float | None,
    static_bytes_per_rank: Sequence[float | Mapping[str, float]],
    flag_gb: float | None = None,
) -> list[float | None]:
    """Per pipeline rank, the activation bytes its kept activations may reach.

    Args:
        device_bytes: memory of one device (None for a CPU, which has no limit of its own).
        static_bytes_per_rank: per rank, its resident bytes: numbers, or the dicts of
            :meth:`~pipeweaver.semu.simulator.Semu.static_bytes`.
        flag_gb: ``--pipeline-memory-limit-gb`` (total per device, GiB) when given; it replaces
            ``device_bytes``.

    Returns:
        One limit per rank, or None per rank when there is no limit (CPU without the flag).

    Raises:
        ScheduleError: the flag is not positive, or a rank's static bytes alone fill the memory
            (names the rank, its static bytes and the memory).
    """
    statics = [static_total(s) for s in static_bytes_per_rank]
    if flag_gb is not None:
        if not flag_gb > 0:
            raise ScheduleError(f"{MEMORY_LIMIT_FLAG} must be > 0 GiB, got {flag_gb}")
        total, source = float(flag_gb) * GIB, f"{MEMORY_LIMIT_FLAG} {flag_gb}"
    elif device_bytes is None:
        return [None] * len(statics)
    else:
        total, source = float(device_bytes), "the device's memory"
    limits: list[float | None] = []
    for rank, static in enumerate(statics):
        if static >= total:
            raise ScheduleError(
                f"parameters, gradients and optimizer states take {static:.0f} bytes, "
                f"{source} is {total:.0f} bytes: no room for activations",
                rank,
            )
        limits.append(total - static)
    return limits
