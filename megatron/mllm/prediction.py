# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What OrchWeave predicted for the step a run just ran, to set beside what it measured.

Two predictions drive OrchWeave's decisions, and both are checked here, iteration by iteration
(``--step-prediction``, and always in profiled iterations):

* **SEMU's** for a pipeline replica (every step but the per-phase balanced one): the step
  simulated with the same microbatches, the same schedule (the runtime's, or the one
  megatron-core's engine runs: no pipelining with PP = 1, 1F1B with PP > 1, padded) and the
  run's calibration (``--cost-calibration``), on a cluster of this run's device type and size.
  Under megatron-core's engine every DP replica is simulated (each one's microbatches, from the
  batch's gathered metadata): the step waits for the slowest, and the prediction's tracks are
  that replica's. The runtime's schedules are known to their own pipeline only, so there the
  step is *this rank's* replica's;
* **the plan's** for the per-phase balanced step (PP = 1): each rank's predicted load of each
  phase (``PhasePlan.loads_after``), in seconds when the cost model is calibrated.

A :class:`PredictedIteration` holds either: its :meth:`~PredictedIteration.record` goes into
``--metrics-jsonl`` as ``prediction`` (last rank), where ``megatron.mllm.explain`` sets it
beside the timers; its events are the prediction's tracks of ``--profile-trace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from megatron.mllm.config import MLLMConfig
from megatron.mllm.config_files import semu_model_spec
from megatron.mllm.partitioning import sub_microbatch_units
from orchestration.calibration import Calibration
from orchestration.packing import pack_sequences
from orchestration.workload import SampleMeta
from pipeweaver.generators import generate
from pipeweaver.placement import Placement
from pipeweaver.schedule import Schedule
from pipeweaver.search.partition import PartitionPlan
from pipeweaver.semu.batches import pack_microbatch, structure_of
from pipeweaver.semu.hardware import DEVICES, ClusterSpec
from pipeweaver.semu.results import Event, StepPrediction
from pipeweaver.semu.simulator import Semu

_GPU_NAMES = {"H100": "h100-sxm", "H200": "h200", "A100": "a100-80gb", "H800": "h800", "H20": "h20"}
"""Substrings of ``torch.cuda.get_device_name()`` and SEMU's device for them."""


def run_cluster(world_size: int, devices_per_node: int) -> ClusterSpec:
    """SEMU's cluster of this run: its device type (CUDA's name, else the CPU), its size."""
    device = DEVICES["cpu"]
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        # Longest match first: "H200" must not read as "H20".
        for key in sorted(_GPU_NAMES, key=len, reverse=True):
            if key in name:
                device = DEVICES[_GPU_NAMES[key]]
                break
    return ClusterSpec(device, world_size, min(devices_per_node, world_size), name="this run")


@dataclass(frozen=True)
class StepInputs:
    """What a prediction of one iteration needs, kept when it ends: the prediction itself runs
    later, off the iterations (at the log line, or at the profile window's end), so that the
    last rank's predicting never delays the next iteration of the other ranks."""

    iteration: int
    """The iteration (1-based)."""

    microbatches: list
    """The samples (``SampleMeta``) of each microbatch this rank's replica ran, in order."""

    schedule: Schedule | None
    """The runtime's schedule; None for megatron-core's engine."""

    pad_to: int | None
    """The fixed microbatch length the step padded to, if any."""

    loads: dict[str, list[float]] | None = None
    """The per-phase balanced step's plan: each phase's load per DP rank (else None)."""

    loads_before: dict[str, list[float]] | None = None
    """The plan's loads had every rank kept its own samples."""

    unit: str = "flops"
    """Unit of the loads."""

    metadata: Any = None
    """The batch's metadata of every DP rank (:class:`~orchestration.metadata.GatheredMetadata`)
    when every rank ran its own samples: under megatron-core's engine, every replica is
    simulated from it (:func:`replica_microbatches`); None: this rank's replica alone."""

    pack_limit: int | None = None
    """``--pack-sequences``: every rank's samples were packed first-fit decreasing into
    microbatches of at most this many LLM tokens (None: the loader's microbatches)."""


def replica_microbatches(metadata, own: Sequence[Sequence[SampleMeta]],
                         pack_limit: int | None = None) -> list | None:  # fmt: skip
    """Every DP rank's microbatches from a batch's gathered metadata
    (:class:`~orchestration.metadata.GatheredMetadata`), cut as this rank's ``own`` are
    (Megatron's order: each rank's samples in loading order, as many per microbatch on every
    rank), or with ``pack_limit`` packed as the step packed them (``--pack-sequences``). None
    when there is one rank, when the metadata cannot rebuild samples (no ids), or when a rank
    holds another number of samples than this one (fitting dropped some), whose cut is then
    unknown."""
    sizes = [len(mb) for mb in own]
    if metadata is None or metadata.num_ranks < 2 or metadata.sample_ids is None:
        return None
    replicas = []
    for rank in range(metadata.num_ranks):
        indices = metadata.rank_samples(rank)
        if len(indices) != sum(sizes):
            return None
        metas = [metadata.sample_meta(s) for s in indices]
        if pack_limit is not None:
            replicas.append(pack_sequences(metas, lambda m: m.llm_tokens, pack_limit))
            continue
        it = iter(metas)
        replicas.append([[next(it) for _ in range(n)] for n in sizes])
    return replicas


class StepPredictor:
    """SEMU set up once for a run; :meth:`predict` simulates one replica's step and
    :meth:`predict_iteration` predicts an iteration from its :class:`StepInputs`."""

    def __init__(self, run, mllm: MLLMConfig, world_size: int,
                 calibration: Calibration | None, dp_ranks: Sequence[int],
                 pp_ranks: Sequence[int], partition: PartitionPlan | None = None):  # fmt: skip
        """Args:
        run: the :class:`~megatron.mllm.run_config.RunConfig`.
        mllm: its model.
        world_size: processes of the run.
        calibration: measured costs of this machine (``--cost-calibration``), or None for
            SEMU's analytic costs.
        dp_ranks: the global ranks of this rank's DP group (a plan's ranks).
        pp_ranks: the global ranks of this rank's pipeline replica (SEMU's tracks).
        partition: the partitioner's plan of the run, if any: its B_i cut the encoders' subs
            as the runtime cuts them.
        """
        self.dp_ranks, self.pp_ranks = list(dp_ranks), list(pp_ranks)
        self.spec = semu_model_spec(run, mllm)
        self.cluster = run_cluster(world_size, run.balance.gpus_per_node)
        self.semu = Semu(self.spec, self.cluster, calibration)
        self.encoders = list(mllm.encoders)
        self.shape = mllm.shape()
        self.sub_tokens = run.pipeline.encoder_sub_microbatch_tokens or None
        self.sub_units = sub_microbatch_units(run, partition)
        self.seq_length = run.seq_length
        self.pipeline = run.parallel.pipeline
        self.layers = {m: mllm.num_layers(m) for m in (*mllm.encoders, "llm")}

    def predict(self, microbatches: Sequence[Sequence[SampleMeta]], schedule: Schedule | None,
                pad_to: int | None, replicas: Sequence | None = None) -> StepPrediction:  # fmt: skip
        """SEMU's step of one replica, or of every replica under megatron-core's engine.

        Args:
            microbatches: the samples of each microbatch the replica ran, in order.
            schedule: the runtime's schedule; None for megatron-core's engine (its order is
                generated: no pipelining with PP = 1, 1F1B otherwise).
            pad_to: the fixed microbatch length the step padded to, if any.
            replicas: with ``schedule`` None, every DP replica's microbatches (each as
                ``microbatches``), in DP group order: the step of them all.
        """
        if schedule is not None or not replicas:
            replicas = [microbatches]
        packed = [
            [
                pack_microbatch(
                    list(samples), self.encoders, pad_to, self.seq_length, self.sub_tokens,
                    lambda s: sum(self.shape.sample_phase_flops(s).values()), self.sub_units,
                )
                for samples in replica
            ]
            for replica in replicas
        ]  # fmt: skip
        if schedule is not None:
            return self.semu.simulate_step([schedule], packed)
        placement = Placement.baseline(self.pipeline, self.layers)
        name = "none" if self.pipeline == 1 else "1f1b"
        schedules = [generate(name, placement, structure_of(mbs, self.encoders)) for mbs in packed]
        return self.semu.simulate_step(schedules, packed)

    def replica_ranks(self, replica: int) -> list[int]:
        """The global ranks of DP replica ``replica``'s pipeline stages: this rank's pipeline
        shifted as its DP group is (Megatron's rank grid strides stages and replicas evenly)."""
        shift = self.dp_ranks[replica] - self.pp_ranks[-1]
        return [r + shift for r in self.pp_ranks]

    def predict_iteration(self, inputs: StepInputs) -> PredictedIteration:
        """The plan's prediction of a per-phase balanced iteration, SEMU's of any other."""
        if inputs.loads:
            return from_plan(inputs.iteration, inputs.loads, inputs.unit, self.dp_ranks,
                             inputs.loads_before)  # fmt: skip
        replicas = None
        if inputs.schedule is None:
            replicas = replica_microbatches(inputs.metadata, inputs.microbatches,
                                            inputs.pack_limit)  # fmt: skip
        step = self.predict(inputs.microbatches, inputs.schedule, inputs.pad_to, replicas)
        ranks = self.replica_ranks(step.critical_replica) if replicas else self.pp_ranks
        return from_semu(inputs.iteration, step, ranks)


@dataclass
class PredictedIteration:
    """What was predicted for one iteration: a timeline, and the figures beside the timers."""

    iteration: int
    """The iteration (1-based, as the log counts)."""

    source: str
    """``semu`` (a pipeline replica's simulated step) or ``plan`` (the balance plan's loads)."""

    ranks: list[int]
    """The global rank of each predicted track."""

    events: list[Event]
    """Predicted intervals, ``rank`` = index into :attr:`ranks`, seconds from the step's start."""

    step_s: float | None
    """The predicted step time (None for a plan: it predicts compute only)."""

    busy_s: list[float]
    """Predicted compute per track (seconds; the plan's unit for a plan)."""

    unit: str = "seconds"
    """Unit of the times: ``seconds``, or ``flops`` for a plan from the FLOP cost model."""

    breakdown: dict[str, float] = field(default_factory=dict)
    """SEMU's critical path: host, a2a, pipeline, allreduce_and_optimizer (seconds)."""

    loads_before: dict[str, list[float]] = field(default_factory=dict)
    """A plan's per-phase loads of every rank before balancing (Megatron's assignment)."""

    def record(self) -> dict[str, Any]:
        """The ``prediction`` entry of ``--metrics-jsonl``."""
        tracks = len(self.ranks)
        categories: dict[str, list[float]] = {}
        actions: dict[str, list[float]] = {}
        phases: dict[str, list[float]] = {}
        for e in self.events:
            seconds = e.end - e.start
            categories.setdefault(e.category, [0.0] * tracks)[e.rank] += seconds
            if e.category in ("F", "B"):
                actions.setdefault(e.name, [0.0] * tracks)[e.rank] += seconds
            phases.setdefault(e.module, [0.0] * tracks)[e.rank] += seconds
        out: dict[str, Any] = {"source": self.source, "ranks": list(self.ranks),
                               "unit": self.unit, "step_s": self.step_s,
                               "busy_s": list(self.busy_s)}  # fmt: skip
        if self.source == "plan":
            out["phases"] = phases
            out["phases_before"] = {p: list(v) for p, v in self.loads_before.items()}
        else:
            zeros = [0.0] * tracks
            out["compute_s"] = {"forward-compute": categories.get("F", zeros),
                                "backward-compute": categories.get("B", zeros)}  # fmt: skip
            out["breakdown"] = dict(self.breakdown)
            out["category_s"] = categories
            out["actions_s"] = actions
        return out


def from_semu(
    iteration: int, step: StepPrediction, replica_ranks: Sequence[int]
) -> PredictedIteration:
    """SEMU's prediction of one replica's step.

    Args:
        iteration: the iteration it predicts.
        step: the prediction.
        replica_ranks: the global rank of each of the replica's pipeline stages, in order.
    """
    return PredictedIteration(
        iteration, "semu", list(replica_ranks), list(step.events), step.step_time_s,
        list(step.busy_s), "seconds", dict(step.breakdown),
    )  # fmt: skip


def from_plan(iteration: int, predicted_loads: dict[str, list[float]], unit: str,
              dp_ranks: Sequence[int],
              loads_before: dict[str, list[float]] | None = None) -> PredictedIteration:  # fmt: skip
    """The balance plan's prediction of the per-phase balanced step: each rank's phases (forward
    and backward together) one after another, in the plan's unit. The plan predicts compute
    only, so it has no step time.

    Args:
        iteration: the iteration it predicts.
        predicted_loads: per phase, each DP rank's predicted load.
        unit: ``seconds`` (calibrated cost model) or ``flops``.
        dp_ranks: the global rank of each DP rank.
        loads_before: per phase, each DP rank's load before balancing.
    """
    events, busy = [], []
    for r in range(len(dp_ranks)):
        t = 0.0
        for phase, loads in predicted_loads.items():
            events.append(Event(r, t, t + loads[r], f"{phase} (planned)", "F+B", phase))
            t += loads[r]
        busy.append(t)
    return PredictedIteration(
        iteration, "plan", list(dp_ranks), events, None, busy, unit, {}, dict(loads_before or {})
    )
