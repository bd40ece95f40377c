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

Optional extensions, all written by ``tools/calibrate.py`` and read by SEMU (older files without
them stay valid):

* per module, ``per_sequence_s`` (extra fixed cost per packed sequence beyond the first),
  ``input_s_per_token`` / ``head_s_per_token`` (the input layer and the head separately; when
  absent, ``edge_s_per_token`` is charged to the chunk that holds the head), and the activation
  bytes kept for backward: ``act_bytes_per_token`` + ``act_bytes_per_token_sq`` * n**2 per layer
  and sequence, ``input_act_bytes_per_token``, ``head_act_bytes_per_token``;
* ``hardware``: measured ``peak_flops`` and ``hbm_bandwidth`` of the device (fills SEMU's
  ``cpu`` entry);
* ``comm``: ``p2p_latency_s``, ``p2p_bandwidth`` (bytes/s) of the transport between ranks;
* ``host``: seconds of host work the step pays outside the layers: ``step_s`` (fixed per step),
  ``microbatch_s`` (per microbatch and rank), ``stage_s`` (per forward or backward of a chunk),
  ``sample_s`` (building one sample's payload), ``feature_s_per_element`` (generating encoder
  input features), ``optimizer_s_per_param`` (one optimizer step per local parameter), and what
  the pipeline runtime pays on a rank's host around its actions (absent = 0):
  ``send_post_s`` (posting one ``isend``), ``send_wait_s`` (waiting one completed send at the
  step's end), ``recv_post_s`` (allocating a buffer and posting one ``irecv``), ``recv_wait_s``
  (a receive action's wait once the tensor has arrived), each as a running step pays it (both
  stages computing), ``recv_post_ready_s`` (posting one ``irecv`` whose tensor the peer has
  sent already, while the peer computes: the post starts the transfer, and the transport's
  threads it wakes take the poster's core), ``recv_post_start_s`` (one of the receives posted
  back to back when the step starts, ``--pipeline-receive-posting step``),
  ``transfer_compute_s`` (the compute a rank loses per transfer it sends or
  receives, to the threads that move the data on the cores it computes on),
  ``runtime_forward_s`` / ``runtime_backward_s`` (the runtime's bookkeeping per forward /
  backward action outside megatron-core's ``forward_step`` / ``backward_step``: gathering
  inputs, routing outputs and gradients), ``sub_split_s`` (cutting one encoder sub-microbatch
  out of a packed microbatch) and ``sub_join_s`` / ``sub_join_backward_s`` (LLM chunk 0
  concatenating one encoder sub's rows in its forward, and splitting their gradient in its
  backward);
* ``machine``: the host the file was measured on (``cpu``, ``cores``, ``torch_threads``) and a
  short probe of its speed (``probe``: ``matmul_s``, ``python_s``; see
  :mod:`orchestration.host_probe`), which SEMU and the balancer rerun to rescale the times on
  another host.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

TABLE_TIME_FIELDS = (
    "const_s", "linear_s", "quadratic_s", "per_sequence_s", "edge_s_per_token",
    "input_s_per_token", "head_s_per_token", "backward_const_s", "backward_linear_s",
    "backward_quadratic_s", "backward_per_sequence_s", "input_const_s", "head_const_s",
    "head_s_per_row", "input_backward_const_s", "input_backward_s_per_token",
    "head_backward_const_s", "head_backward_s_per_token", "head_backward_s_per_row",
    "chunk_const_s", "backward_chunk_const_s",
)  # fmt: skip
"""The fields of a :class:`LayerTimeModel` in seconds (the others are ratios, bytes, counts)."""

HOST_TIME_FIELDS = (
    "sample_s", "feature_s_per_element", "optimizer_step_s", "optimizer_s_per_tensor",
    "optimizer_s_per_param", "forward_step_s", "backward_step_s", "step_s", "microbatch_s",
    "stage_s", "token_s", "send_post_s", "send_wait_s", "recv_post_s", "recv_wait_s",
    "recv_post_ready_s", "recv_post_start_s", "transfer_compute_s", "runtime_forward_s",
    "runtime_backward_s", "sub_split_s", "sub_join_s", "sub_join_backward_s",
)  # fmt: skip
"""The ``host`` entries in seconds (``shared_node_slowdown`` is a ratio)."""

COMM_TIME_FIELDS = ("p2p_latency_s", "allreduce_latency_s")
"""The ``comm`` entries in seconds; the bandwidths (bytes/s) scale inversely."""


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

    per_sequence_s: float = 0.0
    """Extra fixed cost of each packed sequence beyond the first (per-sequence attention)."""

    input_s_per_token: float | None = None
    """Forward seconds per token of the input layer alone (first chunk); None: unknown."""

    head_s_per_token: float | None = None
    """Forward seconds per token of the head alone (last chunk); None: unknown."""

    act_bytes_per_token: float | None = None
    """Activation bytes one layer keeps for backward, per token; None: not measured."""

    act_bytes_per_token_sq: float = 0.0
    """Activation bytes one layer keeps per squared sequence length (score matrices)."""

    input_act_bytes_per_token: float | None = None
    """Activation bytes the input layer keeps, per token."""

    head_act_bytes_per_token: float | None = None
    """Activation bytes the head keeps, per token of the module."""

    # Optional refinements (tools/calibrate.py writes them; older files leave the defaults,
    # which reproduce the ratio-based model above exactly).

    backward_const_s: float | None = None
    """Fixed backward seconds of one layer call; None: backward = backward_ratio x forward."""

    backward_linear_s: float = 0.0
    """Backward seconds per token (with ``backward_const_s``)."""

    backward_quadratic_s: float = 0.0
    """Backward seconds per token squared (with ``backward_const_s``)."""

    backward_per_sequence_s: float = 0.0
    """Backward seconds per packed sequence beyond the first (with ``backward_const_s``)."""

    input_const_s: float = 0.0
    """Fixed forward seconds of the input layer per call (with ``input_s_per_token``)."""

    head_const_s: float = 0.0
    """Fixed forward seconds of the head per call (with ``head_s_per_token``)."""

    head_s_per_row: float = 0.0
    """Forward seconds of an encoder's head per LLM row it produces (the projector)."""

    input_backward_const_s: float | None = None
    """Fixed backward seconds of the input layer; None: the edge's forward x backward_ratio."""

    input_backward_s_per_token: float = 0.0
    """Backward seconds of the input layer per token (with ``input_backward_const_s``)."""

    head_backward_const_s: float | None = None
    """Fixed backward seconds of the head; None: the edge's forward x backward_ratio."""

    head_backward_s_per_token: float = 0.0
    """Backward seconds of the head per token (with ``head_backward_const_s``)."""

    head_backward_s_per_row: float = 0.0
    """Backward seconds of an encoder's head per LLM row (with ``head_backward_const_s``)."""

    head_act_bytes_per_row: float = 0.0
    """Activation bytes an encoder's head keeps per LLM row it produces."""

    chunk_const_s: float = 0.0
    """Fixed forward seconds of one chunk call beyond its layers (the block's own overhead)."""

    backward_chunk_const_s: float = 0.0
    """Fixed backward seconds of one chunk call beyond its layers."""

    layer_param_tensors: int | None = None
    """Parameter tensors of one layer (per-tensor optimizer costs); None: not counted."""

    input_param_tensors: int | None = None
    """Parameter tensors of the input layer."""

    head_param_tensors: int | None = None
    """Parameter tensors of the head (final norm included)."""

    def forward_s(self, n: float) -> float:
        """Forward seconds of one layer on one sequence of ``n`` tokens."""
        return self.const_s + self.linear_s * n + self.quadratic_s * n * n

    def forward_packed_s(self, seq_lens) -> float:
        """Forward seconds of one layer on packed independent sequences (one layer call)."""
        lens = list(seq_lens)
        if not lens:
            return 0.0
        return (
            self.const_s
            + self.per_sequence_s * (len(lens) - 1)
            + self.linear_s * sum(lens)
            + self.quadratic_s * sum(n * n for n in lens)
        )

    def backward_packed_s(self, seq_lens) -> float:
        """Backward seconds of one layer on packed independent sequences (one layer call)."""
        if self.backward_const_s is None:
            return self.forward_packed_s(seq_lens) * self.backward_ratio
        lens = list(seq_lens)
        if not lens:
            return 0.0
        return (
            self.backward_const_s
            + self.backward_per_sequence_s * (len(lens) - 1)
            + self.backward_linear_s * sum(lens)
            + self.backward_quadratic_s * sum(n * n for n in lens)
        )

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

    hardware: dict[str, float] = field(default_factory=dict)
    """Optional measured device peaks: ``peak_flops``, ``hbm_bandwidth``."""

    comm: dict[str, float] = field(default_factory=dict)
    """Optional transport figures: ``p2p_latency_s``, ``p2p_bandwidth``."""

    host: dict[str, float] = field(default_factory=dict)
    """Optional host-side costs of a step (see the module docstring)."""

    machine: dict[str, Any] = field(default_factory=dict)
    """Optional: the host it was measured on and its probe (see the module docstring)."""

    path: str = field(default="", compare=False)
    """The file it was loaded from ("" when built in memory); not written."""

    def scaled(self, factor: float) -> "Calibration":
        """This calibration on a host ``factor`` times slower: every time multiplied by it,
        every rate (FLOP/s, bytes/s) divided by it; ratios, bytes and counts unchanged."""
        tables = {
            m: replace(t, **{k: getattr(t, k) * factor for k in TABLE_TIME_FIELDS if getattr(t, k)})
            for m, t in self.modules.items()
        }
        host = {k: v * factor if k in HOST_TIME_FIELDS else v for k, v in self.host.items()}
        comm = {
            k: v * factor if k in COMM_TIME_FIELDS else v / factor for k, v in self.comm.items()
        }
        hardware = {k: v / factor for k, v in self.hardware.items()}
        return replace(self, modules=tables, host=host, comm=comm, hardware=hardware)

    def over(self, base: "Calibration") -> "Calibration":
        """This calibration's figures laid over ``base``'s: the result has every figure of
        either, this one's where both have it (modules by name, ``host`` and ``comm`` entries
        by key). A re-measure of some stages thus refreshes a full calibration, e.g. the layer
        tables of a shared host whose speed drifts, keeping the transfer figures that took
        several launches to settle (``tools/calibrate.py --base``). The device peaks, efficiency
        and host probe are this one's where it measured layers, since they describe the host
        at the moment the layers were timed.

        Raises:
            ValueError: the two describe modules of different sizes (another model).
        """
        for m in set(self.model) & set(base.model):
            if self.model[m] != base.model[m]:
                raise ValueError(
                    f"{base.path or 'the base calibration'}: module {m} is {base.model[m]}, "
                    f"the new measurement's is {self.model[m]} (another model)"
                )
        layers = bool(self.modules)
        return replace(
            base,
            modules={**base.modules, **self.modules},
            model={**base.model, **self.model},
            efficiency=self.efficiency if layers else base.efficiency,
            source=f"{self.source}; over {base.path or 'a base calibration'}: {base.source}",
            hardware=self.hardware if layers else base.hardware,
            comm={**base.comm, **self.comm},
            host={**base.host, **self.host},
            machine=self.machine if layers else base.machine,
            path="",
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this calibration."""
        out = {
            "device": self.device,
            "source": self.source,
            "model": self.model,
            "modules": {k: asdict(v) for k, v in self.modules.items()},
            "efficiency": self.efficiency,
        }
        for key in ("hardware", "comm", "host", "machine"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

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
            hardware={k: float(v) for k, v in obj.get("hardware", {}).items()},
            comm={k: float(v) for k, v in obj.get("comm", {}).items()},
            host={k: float(v) for k, v in obj.get("host", {}).items()},
            machine=dict(obj.get("machine", {})),
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
        cal = cls.from_json(obj, where=path)
        cal.path = path
        return cal

    def save(self, path: str | os.PathLike) -> None:
        """Write the calibration file."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")
