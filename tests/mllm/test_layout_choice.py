# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""``--pipeline-layout auto``: SEMU's fastest layout on the run's first iterations.

The oracle is SEMU itself, asked once per layout the way ``tools/semu.py --placement L`` asks it
(``build_step`` then ``simulate_step``): the choice must be the fastest of every candidate, the
trainer must build that candidate's placement, and a layout the model cannot take is left out.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import PP2
from equivalence import TINY

from megatron.mllm.arguments import ConfigError
from megatron.mllm.config_files import run_from_flags
from megatron.mllm.layout_choice import LAYOUT_ITERATIONS, candidates, choose_layout, run_layout
from megatron.mllm.partitioning import layer_costs
from megatron.mllm.prediction import run_cluster
from orchestration.calibration import Calibration
from pipeweaver.semu.scenario import build_step
from pipeweaver.semu.simulator import Semu

CALIBRATION = ["--cost-calibration", "scripts/configs/calibration-cpu.json"]


def _semu_step_s(loaded, layout: str) -> float:
    """SEMU's mean step over the iterations the choice simulates, for one layout."""
    costs, _ = layer_costs(loaded.run, loaded.model)
    cluster = run_cluster(2, 2)
    semu = Semu(loaded.semu, cluster, Calibration.load(CALIBRATION[1]))
    total = 0.0
    for it in range(LAYOUT_ITERATIONS):
        schedules, mbs, _ = build_step(loaded.semu, cluster, schedule=loaded.run.pipeline.pipeline_schedule,
                                       placement=layout, pad=False, iteration=it, replicas=1,
                                       layer_costs=costs)  # fmt: skip
        total += semu.simulate_step(schedules, mbs, record_events=False).step_time_s
    return total / LAYOUT_ITERATIONS


@pytest.mark.parametrize("schedule", ["dynamic", "1f1b"])
def test_auto_takes_semus_fastest_layout_and_the_trainer_builds_it(schedule):
    flags = [*TINY, *PP2, *CALIBRATION, "--pipeline-schedule", schedule]
    loaded = run_from_flags([*flags, "--pipeline-layout", "auto"], 2)
    choice = choose_layout(loaded.run, loaded.model, run_cluster(2, 2))
    assert tuple(choice.predicted_s) == candidates(schedule)
    assert ("interleaved" in choice.predicted_s) == (schedule == "dynamic")
    for layout, seconds in choice.predicted_s.items():
        assert seconds == pytest.approx(_semu_step_s(loaded, layout), rel=1e-12), layout
    assert all(choice.fits.values())  # a CPU's memory holds them all
    fastest = min(choice.predicted_s.values())
    assert choice.predicted_s[choice.layout] == fastest
    # Ties keep the earlier candidate (baseline first): the first of the fastest.
    assert choice.layout == next(k for k, v in choice.predicted_s.items() if v == fastest)
    assert choose_layout(loaded.run, loaded.model, run_cluster(2, 2)) == choice  # deterministic
    layout = run_layout(loaded.run, loaded.model)  # what the trainer builds
    assert layout.layout == choice.layout and layout.choice == choice
    assert layout.layer_costs == choice.layer_costs
    # A layout given is built as given.
    given = run_from_flags([*flags, "--pipeline-layout", "balanced-cost"], 2)
    assert run_layout(given.run, given.model).layer_costs == choice.layer_costs
    assert run_layout(given.run, given.model).choice is None


def test_auto_leaves_out_a_layout_the_model_cannot_take():
    # One vision layer cannot be cut over two stages: DIP's per-module layout does not fit,
    # Megatron's stages do.
    flags = [*TINY, *PP2, "--pipeline-schedule", "dynamic", "--vision-num-layers", "1"]
    loaded = run_from_flags([*flags, "--pipeline-layout", "auto"], 2)
    choice = choose_layout(loaded.run, loaded.model, run_cluster(2, 2))
    assert tuple(choice.predicted_s) == ("baseline", "balanced", "balanced-cost")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--pipeline-layout", "auto"], "--pipeline-layout auto needs one of OrchWeave's runtime"),
        (["--pipeline-schedule", "dynamic", "--pipeline-layout", "auto",
          "--audio-chunks-per-stage", "2"], "--audio-chunks-per-stage 2 cuts the audio encoder"),
    ],
)  # fmt: skip
def test_auto_with_flags_it_cannot_honour_is_one_error(flags, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        run_from_flags([*TINY, *PP2, *flags], 2)


def test_auto_takes_the_fastest_layout_that_fits_the_devices_memory():
    # A device whose memory holds only the layout with the smallest peak: the choice is that
    # one, whatever the others' speed (SEMU's peaks asked per layout again).
    loaded = run_from_flags([*TINY, *PP2, *CALIBRATION, "--pipeline-schedule", "dynamic"], 2)
    costs, _ = layer_costs(loaded.run, loaded.model)
    peaks = {}
    cpu = run_cluster(2, 2)
    for layout in candidates("dynamic"):
        for it in range(LAYOUT_ITERATIONS):
            schedules, mbs, _ = build_step(loaded.semu, cpu, schedule="dynamic", placement=layout,
                                           pad=False, iteration=it, replicas=1,
                                           layer_costs=costs)  # fmt: skip
            semu = Semu(loaded.semu, cpu, Calibration.load(CALIBRATION[1]))  # measured bytes
            step = semu.simulate_step(schedules, mbs, record_events=False)
            peaks[layout] = max(peaks.get(layout, 0.0), *step.peak_memory_bytes)
    frugal = min(peaks, key=peaks.__getitem__)  # DIP's layout here: it spreads every module
    cap = peaks[frugal]  # only the most frugal layout fits
    small = dataclasses.replace(cpu, device=dataclasses.replace(cpu.device, hbm_bytes=cap))
    unlimited = choose_layout(loaded.run, loaded.model, cpu)
    choice = choose_layout(loaded.run, loaded.model, small)
    assert peaks[unlimited.layout] > cap  # so the limit changes the choice
    assert choice.predicted_s == unlimited.predicted_s
    assert {k for k, ok in choice.fits.items() if ok} == {k for k in peaks if peaks[k] <= cap}
    assert choice.layout == frugal != unlimited.layout
    assert "(over memory)" in choice.describe()
    # Where nothing fits, the fastest of all.
    tiny = dataclasses.replace(cpu, device=dataclasses.replace(cpu.device, hbm_bytes=cap / 2))
    assert choose_layout(loaded.run, loaded.model, tiny).layout == unlimited.layout
