# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What SEMU predicts: timelines of pipelines and of a whole training step.

Definitions:

* **bubble ratio** of a pipeline: ``1 - sum_r busy_r / (P * T)``, with ``busy_r`` the compute
  time of rank r and ``T`` the time from the pipeline's start to its last compute; for Megatron
  1F1B with equal compute times and free communication it is exactly ``(P-1)/(m+P-1)``. The
  step's bubble ratio is that of its slowest DP replica;
* **MFU**: model FLOPs of the step (real tokens only, no padding, no recompute;
  ``ModelShape`` formula) / (step time x devices x peak FLOP/s);
* **peak memory** per pipeline rank: weights + gradients + optimizer states of its chunks plus
  the peak of activation bytes alive (kept for backward, plus the transient bytes of the
  compute in progress), maximum over DP replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """One interval on one rank's timeline."""

    rank: int
    """Pipeline rank."""

    start: float
    """Seconds from the step's start."""

    end: float
    """Seconds from the step's start."""

    name: str
    """Action string (``l0F3``) or what the interval is (``dp all-reduce``, ``optimizer``)."""

    category: str
    """``F``, ``B`` (compute), ``allreduce``, ``optimizer``, ``host``, ``a2a``."""

    module: str = ""
    """Module of a compute."""

    microbatch: int = -1
    """Microbatch of a compute."""

    chunk: int = -1
    """Chunk of a compute (its module's index), for when its gradients are ready."""


@dataclass
class PipelineResult:
    """The simulated timeline of one pipeline (one DP replica)."""

    makespan: float
    """End of its last compute, from time 0."""

    start: list[float]
    """Per rank, when it could start (host work before the pipeline)."""

    rank_end: list[float]
    """Per rank, end of its last compute (its start when it has none)."""

    busy: list[float]
    """Per rank, compute seconds."""

    peak_activation: list[float]
    """Per rank, peak activation bytes alive (kept plus transient)."""

    events: list[Event] = field(default_factory=list)
    """Compute intervals (when recorded)."""

    @property
    def bubble_ratio(self) -> float:
        """``1 - sum(busy) / (P * T)``, T from the earliest start to the last compute."""
        span = self.makespan - min(self.start)
        if span <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (len(self.busy) * span)


@dataclass
class StepPrediction:
    """What SEMU predicts for one training step."""

    step_time_s: float
    """Seconds of the step."""

    bubble_ratio: float
    """Pipeline bubble of the slowest DP replica (see the module docstring)."""

    mfu: float
    """Model FLOPs utilisation."""

    peak_memory_bytes: list[float]
    """Per pipeline rank: static bytes plus peak activations (max over DP replicas)."""

    peak_activation_bytes: list[float]
    """Per pipeline rank: peak activation bytes (max over DP replicas)."""

    static_bytes: list[dict[str, float]]
    """Per pipeline rank: weights, gradients and optimizer bytes."""

    busy_s: list[float]
    """Per pipeline rank: compute seconds of the slowest replica."""

    idle_s: list[float]
    """Per pipeline rank: ``step_time_s - busy_s``."""

    breakdown: dict[str, float]
    """Critical-path parts: host, a2a, pipeline, allreduce, optimizer seconds."""

    model_flops: float
    """Model FLOPs of the step (all replicas)."""

    num_devices: int
    """Devices of the run (TP x PP x DP)."""

    critical_replica: int
    """Index of the DP replica with the longest pipeline."""

    events: list[Event] = field(default_factory=list)
    """Timeline of the critical replica, plus all-reduce and optimizer intervals."""

    reuse: dict[str, Any] = field(default_factory=dict)
    """Reuse-cache statistics at the end of the simulation."""

    device_memory_bytes: float = 0.0
    """Memory of one device, to compare ``peak_memory_bytes`` with."""

    @property
    def over_memory_ranks(self) -> list[int]:
        """Pipeline ranks whose predicted peak exceeds the device memory."""
        cap = self.device_memory_bytes
        return [r for r, b in enumerate(self.peak_memory_bytes) if cap and b > cap]

    def to_json(self, with_events: bool = False) -> dict[str, Any]:
        """The result as a JSON object (the CLI's ``--json``)."""
        out = {
            "step_time_s": self.step_time_s,
            "bubble_ratio": self.bubble_ratio,
            "mfu": self.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_activation_bytes": self.peak_activation_bytes,
            "static_bytes": self.static_bytes,
            "busy_s": self.busy_s,
            "idle_s": self.idle_s,
            "breakdown": self.breakdown,
            "model_flops": self.model_flops,
            "num_devices": self.num_devices,
            "critical_replica": self.critical_replica,
            "reuse": self.reuse,
            "device_memory_bytes": self.device_memory_bytes,
            "over_memory_ranks": self.over_memory_ranks,
        }
        if with_events:
            out["events"] = [e.__dict__ for e in self.events]
        return out
