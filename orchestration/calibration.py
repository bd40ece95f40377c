# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Measured per-layer times: the calibration file that SEMU and the balancer's costs read.

``tools/calibrate.py`` measures the forward and backward time of one transformer layer of each
module (vision, audio, llm) over a grid of sequence lengths on the current device, and fits, per
module, ``t_fwd(n) = const_s + linear_s * n + quadratic_s * n**2`` seconds for one layer on one
independent sequence of ``n`` tokens, plus ``backward_ratio = t_bwd / t_fwd``. Work outside the
layers (patch/frame embedding, projector, LM head) is ``edge_s_per_token`` per token of that
module. The file is JSON::

    {
      "device": "cpu: Intel Xeon ... x2 threads",
      "source": "tools/calibrate.py 2026-11-29 ...",
      "model": {"vision": {"hidden_size": 64, ...}, ...},
      "modules": {
        "vision": {"const_s": 1e-4, "linear_s": 2e-6, "quadratic_s": 1e-9,
                   "backward_ratio": 2.1, "edge_s_per_token": 3e-7},
        ...
      },
      "efficiency": {"compute": 0.35, "memory": 0.6}
    }

``efficiency`` is optional: the fitted fraction of the device's peak FLOP/s and bandwidth that
SEMU's analytical op costs use when no per-module table applies.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class LayerTimeModel:
    """Fitted time of one transformer layer of a module, per independent sequence."""

    const_s: float
    """Fixed cost of running the layer once on one sequence (kernel launches, Python)."""

    linear_s: float
    """Seconds per token (matrix multiplies, elementwise work)."""

    quadratic_s: float
    """Seconds per token squared (attention scores and weighted sum)."""

    backward_ratio: float = 2.0
    """Backward time over forward time."""

    edge_s_per_token: float = 0.0
    """Forward seconds per token outside the layers (input embedding, projector or LM head)."""

    def forward_s(self, n: float) -> float:
        """Forward seconds of one layer on one sequence of ``n`` tokens."""
        return self.const_s + self.linear_s * n + self.quadratic_s * n * n

    def train_s(self, n: float) -> float:
        """Forward plus backward seconds of one layer on one sequence of ``n`` tokens."""
        return self.forward_s(n) * (1.0 + self.backward_ratio)


@dataclass
class Calibration:
    """Per-module layer time models measured on one device."""

    device: str
    """What was measured: device name, threads or GPU model."""

    modules: dict[str, LayerTimeModel] = field(default_factory=dict)
    """Time model per module ("vision", "audio", "llm")."""

    model: dict[str, Any] = field(default_factory=dict)
    """Sizes of the measured modules (hidden size, heads, ...), to detect a mismatch."""

    efficiency: dict[str, float] = field(default_factory=dict)
    """Optional fitted efficiency factors: ``compute`` and ``memory`` fractions of peak."""

    source: str = ""
    """How and when it was measured."""

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this calibration."""
        return {
            "device": self.device,
            "source": self.source,
            "model": self.model,
            "modules": {k: asdict(v) for k, v in self.modules.items()},
            "efficiency": self.efficiency,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], where: str = "calibration") -> "Calibration":
        """Build from the JSON object; raises ValueError naming the bad field."""
        try:
            modules = {k: LayerTimeModel(**v) for k, v in obj["modules"].items()}
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed 'modules' ({e})") from e
        return cls(
            device=str(obj.get("device", "unknown")),
            modules=modules,
            model=dict(obj.get("model", {})),
            efficiency=dict(obj.get("efficiency", {})),
            source=str(obj.get("source", "")),
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Calibration":
        """Read a calibration file."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ValueError(f"calibration file not found: {path}")
        with open(path, encoding="utf-8") as f:
            try:
                obj = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: malformed JSON ({e.msg} at line {e.lineno})") from e
        return cls.from_json(obj, where=path)

    def save(self, path: str | os.PathLike) -> None:
        """Write the calibration file."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
