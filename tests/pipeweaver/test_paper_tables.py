# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""tools/bench/paper_tables.py: the row table is well formed, the error arithmetic is right,
and one cheap row is simulated in process (the paper rows take minutes: not here). The row
itself simulates in under a second; the first SEMU call of a process also pays its one-time
start-up (10-30 s on the loaded 2-core host), which the suite's other in-process SEMU tests
share."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from bench_modules import bench_module


@pytest.fixture(scope="module")
def pt():
    return bench_module("paper_tables")


@pytest.fixture(scope="module")
def pr(pt):
    """The rows' module (``paper_rows``, which ``paper_tables`` imports as a sibling)."""
    return bench_module("paper_rows")


def test_error_arithmetic(pr):
    assert pr.error_pct(40.0, 44.0) == pytest.approx(10.0)
    assert pr.error_pct(0.416, 0.208) == pytest.approx(-50.0)
    assert pr.error_pct(None, 1.0) is None and pr.error_pct(1.0, None) is None
    rows = [
        pr.Row("a", "s", "s", 10.0, 12.0, baseline=True),
        pr.Row("b", "s", "s", 10.0, 7.0, baseline=True),
        pr.Row("c", "s", "x", 1.0, 9.0),  # not a baseline row: not counted
        pr.Row("d", "s", "s", 10.0, note="no config yet", baseline=True),  # unmatched
    ]
    assert pr.worst_baseline_error(rows) == pytest.approx(30.0)
    assert pr.worst_baseline_error(rows[2:]) is None


def test_ranges_and_bounds_are_counted_by_their_distance(pr):
    """A row whose input the paper leaves out counts 0 with the paper's figure inside SEMU's
    range and the nearer end's error outside it; a bound counts only the wrong side."""
    inside = pr.Row("a", "s", "s", 10.0, 13.0, baseline=True, span=(5.0, 20.0))
    below = pr.Row("b", "s", "s", 10.0, 13.0, baseline=True, span=(12.0, 30.0))
    above = pr.Row("c", "s", "s", 10.0, 6.0, baseline=True, span=(8.0, 4.0))
    assert inside.error_pct == pytest.approx(30.0) and inside.counted_error_pct == 0.0
    assert below.counted_error_pct == pytest.approx(20.0)
    assert above.counted_error_pct == pytest.approx(-20.0)  # the ends in either order
    over = pr.Row("d", "s", "mfu", 0.134, 0.181, baseline=True, bound=">=")
    under = pr.Row("e", "s", "mfu", 0.134, 0.067, baseline=True, bound=">=")
    assert over.counted_error_pct == 0.0 and under.counted_error_pct == pytest.approx(-50.0)
    assert pr.Row("f", "s", "x", 2.0, 3.0, bound="<=").counted_error_pct == pytest.approx(50.0)
    assert pr.worst_baseline_error([inside, below, above, over, under]) == pytest.approx(50.0)
    assert pr.worst_baseline_error([inside, over]) == 0.0
    lines = pr.format_rows([below, over])
    assert lines[3].startswith("    range: SEMU 12.000 s to 30.000 s") and "outside" in lines[3]
    assert ">=13.4%" in lines[4] and "+35.1%" in lines[4] and "+0.0%" in lines[4]


def test_unmatched_rows_are_printed_with_a_reason(pt, pr, capsys):
    rows = pt.rows_no_config(argparse.Namespace(iteration=0))
    assert rows and all(r.semu is None and r.note for r in rows)
    lines = pr.format_rows(rows)
    assert len(lines) == 1 + 3 * len(rows)  # header; per row: figures, config, note
    assert all(line.startswith("    note: ") for line in lines[3::3])
    assert pt.main(["--rows", "no-config"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1] == "paper_tables_worst_baseline_error_pct: n/a"
    assert sum(line.startswith("paper_tables_") for line in out) == 1


def test_groups_and_paper_figures(pt):
    assert set(pt.DEFAULT_GROUPS) <= set(pt.GROUPS)
    assert pt.PAPER_T4 == {"fsdp": 40.270, "megatron": 39.053, "dip": 28.606}
    assert pt.ORCH_MFU / pt.ORCH_SPEEDUP == pytest.approx(0.134, abs=5e-4)


def test_one_cheap_row_simulated(pt, pr):
    got, used = pt.megatron_fit(["--model", "cpu-main", "--cluster", "cpu-2ranks"])
    assert got["step_time_s"] > 0 and used[-2:] != ["--memory", "recompute"]  # a CPU: no limit
    row = pr.Row("cpu-main", "test", "s", 2 * got["step_time_s"], got["step_time_s"],
                 baseline=True)  # fmt: skip
    assert row.error_pct == pytest.approx(-50.0)
    assert pr.worst_baseline_error([row]) == pytest.approx(50.0)
    line = pr.format_rows([row])[1]
    assert "-50.0%" in line and line.rstrip().endswith("yes")


def test_megatron_fit_takes_the_least_recompute_that_fits(pt, monkeypatch):
    """As is, then Megatron's block recompute of the least N layers that fits (brute force's
    first N, found by bisection), then every chunk; a step that fits nothing keeps the last
    resort."""
    calls = []

    def fake(fits_from):
        def semu_json(argv):
            calls.append(argv)
            n = next((int(a.split("=")[1]) for a in argv if a.startswith("recompute-num")), 0)
            if "--memory" in argv:
                n = 999
            return {"over_memory_ranks": [] if n >= fits_from else [0], "n": n}

        return semu_json

    for fits_from in (1, 4, 5, 77, pt.MOST_BLOCK_LAYERS):
        calls.clear()
        monkeypatch.setattr(pt, "semu_json", fake(fits_from))
        got, used = pt.megatron_fit(["--model", "m"])
        assert got["n"] == fits_from and used[-1] == f"recompute-num-layers={fits_from}"
        assert pt.recompute_used(used) == (
            f"block recompute of each chunk's first {fits_from} layers"
        )
        assert len(calls) <= 2 + math.ceil(math.log2(pt.MOST_BLOCK_LAYERS))
    calls.clear()
    monkeypatch.setattr(pt, "semu_json", fake(0))
    got, used = pt.megatron_fit(["--model", "m"])
    assert (
        len(calls) == 1 and used == ["--model", "m"] and pt.recompute_used(used) == "no recompute"
    )
    calls.clear()
    monkeypatch.setattr(pt, "semu_json", fake(pt.MOST_BLOCK_LAYERS + 1))  # no block fits
    got, used = pt.megatron_fit(["--model", "m"])
    assert used[-2:] == ["--memory", "recompute"] and not got["over_memory_ranks"]
    assert len(calls) == 3  # as is, the most layers, every chunk


def test_table1_configs_hold_the_tables_flops(pt):
    """The LM row's assumed global batch gives the 12.8 PFLOPs per iteration Table 1 states,
    and the static ViT + LM row the 12.7 (within 2%)."""
    for model, pflops in (("dip-t1-lm7b", 12.8), ("dip-t1-vlm-static", 12.7)):
        got = pt.semu_json(["--model", model, "--cluster", "h800-8", "--placement", "balanced",
                            "--replicas", "1", "--no-check"])  # fmt: skip
        assert got["model_flops"] / 1e15 == pytest.approx(pflops, rel=0.02), model


def test_a_components_share_is_set_and_the_others_keep_their_proportions(pt, tmp_path):
    """Table 4's data-mix sweep: the LAION component gets exactly the share asked, the others
    keep their proportions, the file is a valid workload, and a name no component holds (or
    every component holds) is refused."""
    import workload_mix

    from megatron.mllm.config_files import CONFIG_DIR
    from orchestration.workload_spec import WorkloadSpec

    spec = CONFIG_DIR / "workloads" / "dip-vlm-packed.json"
    before = {c["name"]: c["weight"] for c in json.loads(spec.read_text())["components"]}
    for share in pt.T4_LAION_SHARES:
        path = workload_mix.with_component_share(spec, "LAION", share, str(tmp_path))
        loaded = WorkloadSpec.load(path)
        weights = {c["name"]: c["weight"] for c in loaded.components}
        laion = [n for n in weights if "LAION" in n]
        others = [n for n in weights if "LAION" not in n]
        assert sum(weights[n] for n in laion) == pytest.approx(share)
        assert sum(weights.values()) == pytest.approx(1.0)
        ratio = weights[others[0]] / before[others[0]]
        assert all(weights[n] == pytest.approx(before[n] * ratio) for n in others)
    for name in ("no such component", ""):
        with pytest.raises(ValueError, match="cannot give the components named"):
            workload_mix.with_component_share(spec, name, 0.1, str(tmp_path))
