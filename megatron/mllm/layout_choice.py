# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``--pipeline-layout auto``: SEMU picks where the layers live, on the run's own first batches.

Which layout is fastest depends on the model, the data and the machine: on this repository's CPU
model at PP=2, DIP's per-module cut (``interleaved``) makes the dynamic pipeline 14-22% slower
than 1F1B on Megatron's layout, and stages of balanced parameters make it 9-13% faster (README,
"Where the layers live"), while on a GPU with large encoders the per-module cut is what DIP
gains from.
So the run simulates its schedule on every candidate layout with SEMU, on its first
:data:`LAYOUT_ITERATIONS` iterations (Megatron's order, one DP replica), with
``--cost-calibration`` (else SEMU's defaults for the device), and takes the fastest whose peak
memory fits the device (the fastest of all where none does); ties keep the earlier candidate
(``baseline`` first, Megatron's).

Every rank computes the same choice from the same inputs (flags, calibration file, workload),
so no message is needed, and a resumed run chooses again alike. Pure of ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

from megatron.mllm.config_files import semu_model_spec
from megatron.mllm.partitioning import layer_costs, sub_microbatch_units
from megatron.mllm.run_config import RunConfig
from orchestration.calibration import Calibration
from pipeweaver.ir import ScheduleError
from pipeweaver.semu.hardware import ClusterSpec
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

if TYPE_CHECKING:  # the model's config imports torch; the choice needs only its sizes
    from megatron.mllm.config import MLLMConfig

LAYOUT_ITERATIONS = 4
"""Iterations from the first that SEMU simulates on each candidate layout."""


@dataclass(frozen=True)
class LayoutChoice:
    """What ``--pipeline-layout auto`` chose, and why."""

    layout: str
    """The layout chosen (the fastest predicted)."""

    predicted_s: Mapping[str, float]
    """Every candidate's mean predicted step time over the iterations simulated, in order."""

    fits: Mapping[str, bool]
    """Per candidate, whether SEMU's peak memory fits the device on every rank in every
    iteration simulated."""

    layer_costs: Mapping[str, Sequence[float]]
    """Each layer's cost (``balanced-cost``'s weights, also when another layout wins)."""

    costs_source: str
    """What the costs are, and where they came from."""

    def describe(self) -> str:
        """The choice and every candidate's prediction, for the setup line."""
        times = ", ".join(
            f"{k} {1e3 * t:.4g} ms{'' if self.fits[k] else ' (over memory)'}"
            for k, t in self.predicted_s.items()
        )
        return (
            f"--pipeline-layout auto chose {self.layout} (SEMU's step over iterations 1-"
            f"{LAYOUT_ITERATIONS}: {times})"
        )


def candidates(schedule: str) -> tuple[str, ...]:
    """The layouts ``auto`` compares for a runtime schedule: Megatron's stages always, DIP's
    per-module cut for the dynamic pipeline only (the others run one stage per rank)."""
    stages = ("baseline", "balanced", "balanced-cost")
    return (*stages, "interleaved") if schedule == "dynamic" else stages


def choose_layout(
    run: RunConfig,
    mllm: "MLLMConfig",
    cluster: ClusterSpec,
    calibration: Calibration | str | None = None,
) -> LayoutChoice:
    """The fastest layout by SEMU for this run's schedule (see the module docstring).

    Args:
        run: the run's flags (``--pipeline-layout auto`` or not: every candidate is scored).
        mllm: its model.
        cluster: SEMU's cluster of the run (``megatron.mllm.prediction.run_cluster``).
        calibration: the measured costs (or their file); default ``--cost-calibration``'s.

    Raises:
        ScheduleError: no candidate fits the model (each one's reason named).
    """
    calibration = calibration or run.balance.cost_calibration
    costs, source = layer_costs(run, mllm, calibration)  # a file's name is in the source
    if isinstance(calibration, str):
        calibration = Calibration.load(calibration)
    spec = semu_model_spec(run, mllm)
    semu = Semu(spec, cluster, calibration)
    schedule = run.pipeline.pipeline_schedule
    sub_units = sub_microbatch_units(run, None)
    predicted, fits, unfit = {}, {}, []
    for layout in candidates(schedule):
        total = 0.0
        try:
            steps = [
                build_step(
                    spec,
                    cluster,
                    schedule=schedule,
                    placement=layout,
                    chunks_per_rank={"llm": spec.parallel.llm_chunks_per_rank},
                    pad=False,
                    iteration=iteration,
                    replicas=1,
                    encoder_sub_microbatch_units=sub_units,
                    layer_costs=costs,
                )
                for iteration in range(LAYOUT_ITERATIONS)
            ]
        except ScheduleError as e:  # e.g. an encoder with fewer layers than stages
            unfit.append(f"{layout}: {e}")
            continue
        fits[layout] = True
        for schedules, mbs, _ in steps:
            step = semu.simulate_step(schedules, mbs, record_events=False)
            total += step.step_time_s
            fits[layout] = fits[layout] and not step.over_memory_ranks
        predicted[layout] = total / LAYOUT_ITERATIONS
    if not predicted:
        raise ScheduleError("no layout fits the model: " + "; ".join(unfit))
    # The fastest that fits the device's memory; where none does (the dynamic pipeline's
    # search may still recompute to fit), the fastest. The first of equals: dicts keep order.
    pool = [k for k in predicted if fits[k]] or list(predicted)
    best = min(pool, key=predicted.__getitem__)
    return LayoutChoice(best, predicted, fits, costs, source)


@dataclass(frozen=True)
class RunLayout:
    """The layout a run's runtime builds: ``--pipeline-layout`` as given, or as ``auto`` chose."""

    layout: str
    """The layout (never ``auto``)."""

    layer_costs: Mapping[str, Sequence[float]] | None
    """Each layer's cost, where computed (``balanced-cost``, ``auto``), else None."""

    costs_source: str = ""
    """What the costs are, and where they came from."""

    choice: LayoutChoice | None = None
    """What ``auto`` chose, and why; None for a layout given."""


def run_layout(run: RunConfig, mllm: "MLLMConfig") -> RunLayout:
    """The layout of the run's runtime (:func:`megatron.mllm.steps.build_stage_model`), alike
    on every rank: the flags, the calibration file and the workload decide."""
    layout = run.pipeline.layout
    if layout == "auto":
        from megatron.mllm.prediction import run_cluster  # imports torch

        cluster = run_cluster(run.parallel.world_size, run.balance.gpus_per_node)
        choice = choose_layout(run, mllm, cluster)
        return RunLayout(choice.layout, choice.layer_costs, choice.costs_source, choice)
    if layout == "balanced-cost":
        return RunLayout(layout, *layer_costs(run, mllm))
    return RunLayout(layout, None)
