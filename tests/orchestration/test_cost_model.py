# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Tests of the per-phase cost models: FLOPs coefficients, calibration, padding, attribution."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestration.calibration import Calibration, LayerTimeModel
from orchestration.cost_model import CostModel, PhaseCostModel, unit_output_tokens
from orchestration.model_shape import ModelShape, TransformerShape


def _shape(gated: bool = False, groups: int | None = None) -> ModelShape:
    """A small three-phase model with distinct sizes per phase (and GQA in the LLM)."""
    llm = TransformerShape(
        num_layers=3,
        hidden_size=96,
        ffn_hidden_size=256,
        num_attention_heads=8,
        num_query_groups=groups,
        gated_mlp=gated,
        causal=True,
        output_flops_per_token=2.0 * 96 * 1000,
    )
    vision = TransformerShape(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        input_flops_per_token=2.0 * 48 * 64,
        output_flops_per_token=2.0 * (64 * 256 + 256 * 96),
    )
    audio = TransformerShape(
        num_layers=4,
        hidden_size=32,
        ffn_hidden_size=64,
        num_attention_heads=2,
        input_flops_per_token=2.0 * 80 * 32,
        output_flops_per_token=2.0 * (32 * 256 + 256 * 96),
    )
    return ModelShape(llm=llm, encoders={"vision": vision, "audio": audio})


@pytest.mark.parametrize("gated,groups", [(False, None), (True, 2)])
@pytest.mark.parametrize("phase", ["vision", "audio", "llm"])
@pytest.mark.parametrize("n,out", [(1, 0), (7, 3), (576, 144), (4096, 1024)])
def test_flops_coefficients_match_model_shape(phase, n, out, gated, groups):
    shape = _shape(gated, groups)
    model = PhaseCostModel.from_shape(shape, phase)
    assert model.unit == "flops" and model.const == 0.0
    expected = shape.phase_flops(phase, [n], out)
    assert model.item_cost(n, out) == pytest.approx(expected, rel=1e-12)
    vec = model.item_costs(np.array([n, n]), np.array([out, out]))
    assert vec == pytest.approx([expected, expected], rel=1e-12)


def test_llm_attention_is_causal_halved():
    shape = _shape()
    llm = PhaseCostModel.from_shape(shape, "llm")
    # 3 (train) x layers x 4 h (scores + weighted sum) / 2 (causal)
    assert llm.quadratic == pytest.approx(3 * 3 * 4 * 96 / 2)
    vision = PhaseCostModel.from_shape(shape, "vision")
    assert vision.quadratic == pytest.approx(3 * 2 * 4 * 64)
    assert llm.per_output_token == 0.0  # the LM head is in the linear term
    assert vision.per_output_token == pytest.approx(3 * 2.0 * (64 * 256 + 256 * 96))


def test_unknown_phase_is_a_clear_error():
    shape = ModelShape(llm=_shape().llm, encoders={})
    with pytest.raises(ValueError, match="no phase 'vision'"):
        PhaseCostModel.from_shape(shape, "vision")
    model = CostModel.build(shape)
    assert model.phase_order == ("llm",)
    with pytest.raises(KeyError, match="no cost model for phase 'audio'"):
        model["audio"]


def _calibration(**model) -> Calibration:
    return Calibration(
        device="test",
        modules={
            "vision": LayerTimeModel(1e-4, 2e-6, 3e-9, backward_ratio=2.0, edge_s_per_token=5e-7),
            "audio": LayerTimeModel(2e-4, 1e-6, 1e-9, backward_ratio=1.5),
            "llm": LayerTimeModel(3e-4, 4e-6, 2e-9, backward_ratio=2.2, edge_s_per_token=1e-6),
        },
        model=model,
    )


@pytest.mark.parametrize("phase", ["vision", "audio", "llm"])
def test_calibration_overrides_coefficients(phase):
    shape = _shape()
    calib = _calibration()
    flops = PhaseCostModel.from_shape(shape, phase)
    model = PhaseCostModel.from_calibration(calib, shape, phase)
    fit = calib.modules[phase]
    layers = shape.llm.num_layers if phase == "llm" else shape.encoders[phase].num_layers
    assert model.unit == "seconds"
    assert model.per_output_token == 0.0  # the projector is in the measured edge term
    for n in (1, 100, 3000):
        # Per layer: the fit without its per-call constant (paid once per packed call).
        per_layer = (fit.forward_s(n) - fit.const_s) * (1 + fit.backward_ratio)
        expected = layers * per_layer + fit.edge_s_per_token * n * (1 + fit.backward_ratio)
        assert model.item_cost(n, out_tokens=50) == pytest.approx(expected, rel=1e-12)
    assert (model.linear, model.quadratic) != (flops.linear, flops.quadratic)
    built = CostModel.build(shape, calib)
    assert built[phase] == model and built.unit == "seconds"


def test_calibrated_per_sequence_cost_is_the_item_constant():
    shape = _shape()
    calib = _calibration()
    fit = calib.modules["llm"]
    if not hasattr(fit, "per_sequence_s"):
        pytest.skip("this Calibration has no per_sequence_s")
    calib.modules["llm"] = dataclasses.replace(fit, per_sequence_s=5e-5)
    model = PhaseCostModel.from_calibration(calib, shape, "llm")
    assert model.const == pytest.approx(shape.llm.num_layers * 5e-5 * (1 + fit.backward_ratio))


def test_calibration_mismatch_and_missing_module_are_clear_errors():
    shape = _shape()
    with pytest.raises(ValueError, match="measured vision with hidden_size=128"):
        PhaseCostModel.from_calibration(_calibration(vision={"hidden_size": 128}), shape, "vision")
    ok = PhaseCostModel.from_calibration(
        _calibration(vision={"hidden_size": 128}), shape, "vision", strict=False
    )
    assert ok.unit == "seconds"
    calib = _calibration()
    del calib.modules["audio"]
    with pytest.raises(ValueError, match="has no module 'audio'"):
        CostModel.build(shape, calib)


def test_padded_cost_is_count_times_longest():
    model = PhaseCostModel("audio", linear=2.0, quadratic=0.5, const=3.0, per_output_token=1.0)
    f = lambda n: 2.0 * n + 0.5 * n * n + 3.0  # noqa: E731
    assert model.padded_cost([10, 30, 20], out_tokens=7) == pytest.approx(3 * f(30) + 7)
    assert model.padded_cost([10, 20], pad_to=40) == pytest.approx(2 * f(40))
    assert model.padded_cost([]) == 0.0
    with pytest.raises(ValueError, match="exceeds pad_to=15"):
        model.padded_cost([10, 20], pad_to=15)
    padded = CostModel.build(_shape(), padded={"audio": 1500})
    assert padded["audio"].padded and padded["audio"].pad_to == 1500
    assert not padded["vision"].padded


def test_bad_coefficients_are_rejected():
    with pytest.raises(ValueError, match="linear must be finite and >= 0"):
        PhaseCostModel("llm", linear=-1.0, quadratic=0.0)
    with pytest.raises(ValueError, match="cost unit"):
        PhaseCostModel("llm", linear=1.0, quadratic=0.0, unit="joules")


def _pooled_first_unit(units: list[int], k: int) -> list[int]:
    """Oracle: rows whose first pooled encoder token lies in each unit (batch.pooling_pairs)."""
    e = sum(units)
    bounds = np.cumsum([0] + units)
    counts = [0] * len(units)
    for r in range(k):
        first = (r * e) // k
        counts[int(np.searchsorted(bounds, first, side="right")) - 1] += 1
    return counts


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(1, 40), min_size=1, max_size=5), st.integers(1, 90)),
        min_size=1,
        max_size=6,
    )
)
def test_unit_output_tokens_attribute_pooled_rows(items):
    unit_tokens = [u for units, _ in items for u in units]
    unit_item = [i for i, (units, _) in enumerate(items) for _ in units]
    llm = [k for _, k in items]
    got = unit_output_tokens(np.array(unit_tokens), np.array(unit_item), np.array(llm))
    expected = [c for units, k in items for c in _pooled_first_unit(units, k)]
    assert got.tolist() == expected
    sums = np.bincount(unit_item, weights=got, minlength=len(items))
    assert sums.tolist() == llm
    # Pro rata up to rounding: each unit within one row of its exact share.
    share = np.array([k * u / sum(units) for units, k in items for u in units])
    assert np.all(np.abs(got - share) < 1.0 + 1e-9)


def test_unit_output_tokens_empty():
    assert unit_output_tokens(np.zeros(0), np.zeros(0), np.zeros(0)).size == 0
    assert math.isclose(PhaseCostModel("llm", 1.0, 0.0).item_cost(0), 0.0)
