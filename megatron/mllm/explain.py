# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where a step went, measured beside predicted: the library of ``orchweave-explain-step``.

Input: the per-iteration records of a run (``--metrics-jsonl`` with ``--timing-log-level 2``
and ``--step-prediction``, or the ``records`` of a ``--profile-trace``), each with ``timers``
(:func:`megatron.mllm.timers.iteration_record`) and ``prediction``
(:meth:`megatron.mllm.prediction.PredictedIteration.record`).

Each rank's iteration is cut into **terms** that add up to its measured iteration time, each
beside the prediction that should have foreseen it:

========================  =====================================  ==============================
term                      measured (timers' self time)           predicted by
========================  =====================================  ==============================
compute                   forward/backward compute, encoders     the cost model (SEMU's layer
                                                                 costs, or the plan's loads)
pipeline waits            recv-wait, send-drain                  SEMU's schedule and p2p model
                                                                 (the rest of its step)
collective waits          each collective from this rank's       the plan (each phase's
                          arrival to the group's last arrival    slowest rank); SEMU: none
transfers                 the collectives after the last         SEMU's all-reduce and
                          arrival (exchange, gradients, loss)    all-to-all model
host                      data loading, planning, packing, the   SEMU's host costs (calibrated
                          runtime's posting, untimed host code   per step and per microbatch)
optimizer                 the optimizer step                     SEMU's optimizer cost
========================  =====================================  ==============================

A plan predicts compute (and the waits that its loads imply) only; its loads in FLOPs are put
in seconds at the rate the run measured (its compute seconds over the plan's FLOPs). Means over
the iterations after ``skip`` warm-up ones are reported, so the terms still add up.

Pure Python (no torch): records in, text out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from megatron.mllm.timers import BACKWARD_TIMERS, FORWARD_TIMERS, PIPELINE_WAIT_TIMERS
from pipeweaver.ir import LETTER_MODULE

TERMS = ("compute", "pipeline waits", "collective waits", "transfers", "host", "optimizer")
"""The terms, in the order they are explained."""

PREDICTED_BY = {
    "semu": {
        "compute": "SEMU's layer costs x tokens",
        "pipeline waits": "SEMU's schedule and p2p model",
        "collective waits": "SEMU (its ranks arrive together)",
        "transfers": "SEMU's collective model",
        "host": "SEMU's host costs (data, planning, posting)",
        "optimizer": "SEMU's optimizer cost",
    },
    "plan": {"compute": "the plan's cost model", "collective waits": "the plan's load balance"},
}
"""Which prediction of each source stands for each term."""

_COMPUTE = FORWARD_TIMERS + BACKWARD_TIMERS


class ExplainError(ValueError):
    """The input cannot be explained (no timers, no prediction); the message says why."""


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Per-iteration records of a metrics JSONL or a ``--profile-trace`` JSON."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ExplainError(f"cannot read {path}: {e.strerror}") from None
    try:
        if path.suffix == ".jsonl":
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            records = json.loads(text).get("otherData", {}).get("records", [])
    except (json.JSONDecodeError, AttributeError) as e:
        raise ExplainError(f"{path} is neither a metrics JSONL nor a profile trace: {e}") from None
    timed = [r for r in records if "timers" in r]
    if not timed:
        raise ExplainError(
            f"{path} has no timers: run with --timing-log-level 2 --step-prediction "
            "--metrics-jsonl FILE (or --profile --profile-trace FILE)"
        )
    return timed


def _term_of(name: str, collectives: Mapping[str, Any]) -> str:
    """The term a timer's self time belongs to (a collective's is split into its wait and its
    transfer by the caller)."""
    if name in _COMPUTE:
        return "compute"
    if name in PIPELINE_WAIT_TIMERS:
        return "pipeline waits"
    if name in collectives:
        return "collective"
    if name.startswith("optimizer"):
        return "optimizer"
    return "host"


def measured_terms(timers: Mapping[str, Any], rank: int) -> dict[str, float]:
    """One rank's measured iteration cut into :data:`TERMS` (they add up to it)."""
    other = timers["partition"].get("other", [0.0] * (rank + 1))[rank]
    terms = dict.fromkeys(TERMS, 0.0)
    collectives = timers.get("collectives", {})
    for name, per_rank in timers["exclusive"].items():
        seconds, term = per_rank[rank], _term_of(name, collectives)
        if term == "collective":
            wait = min(collectives[name]["wait"][rank], seconds)
            terms["collective waits"] += wait
            terms["transfers"] += seconds - wait
        else:
            terms[term] += seconds
    terms["host"] += other
    return terms


def host_detail(timers: Mapping[str, Any], rank: int) -> dict[str, float]:
    """The host term's parts (self time per timer name, and ``other``)."""
    collectives = timers.get("collectives", {})
    out = {
        name: v[rank]
        for name, v in timers["exclusive"].items()
        if _term_of(name, collectives) == "host"
    }
    out["untimed"] = timers["partition"].get("other", [0.0] * (rank + 1))[rank]
    return out


def measured_phases(timers: Mapping[str, Any], rank: int) -> dict[str, float]:
    """One rank's compute per module (vision, audio, llm), forward and backward together."""
    detail = timers.get("detail", {})
    out: dict[str, float] = {}
    for name in _COMPUTE:
        for module, v in detail.get(name, {}).items():
            out[module] = out.get(module, 0.0) + v[rank]
    # An encoder's backward span holds the transposed exchange of its outputs.
    for label, v in detail.get("all-to-all", {}).items():
        module = label.split(" ", 1)[0]
        if label.endswith("outputs backward") and module in out:
            out[module] -= v[rank]
    if "llm" not in out and "forward-compute" in timers["seconds"] and "encoder-forward" in detail:
        # The per-phase balanced step: megatron-core's own timers are the LLM microbatches.
        out["llm"] = sum(timers["seconds"][n][rank] for n in ("forward-compute", "backward-compute")
                         if n in timers["seconds"])  # fmt: skip
    return out


@dataclass
class Prediction:
    """One iteration's prediction as terms per rank, in seconds."""

    source: str
    """``semu`` or ``plan``."""

    terms: dict[int, dict[str, float | None]]
    """Per global rank, seconds per term; None where the source predicts nothing."""

    phases: dict[int, dict[str, float]]
    """Per global rank, predicted compute per module."""


def semu_terms(record: Mapping[str, Any]) -> Prediction:
    """SEMU's step as terms: its compute, host, all-reduce and optimizer intervals, and the rest
    of its step (the pipeline's bubbles and transfers)."""
    step = record["step_s"]
    cats = record.get("category_s", {})
    terms, phases = {}, {}
    for i, rank in enumerate(record["ranks"]):
        t = {
            "compute": record["busy_s"][i],
            "collective waits": 0.0,
            "transfers": cats.get("allreduce", [0.0] * (i + 1))[i] + cats.get("a2a", [0.0] * (i + 1))[i],
            "host": cats.get("host", [0.0] * (i + 1))[i],
            "optimizer": cats.get("optimizer", [0.0] * (i + 1))[i],
        }  # fmt: skip
        t["pipeline waits"] = step - sum(t.values())
        terms[rank] = t
        per: dict[str, float] = {}
        for action, v in record.get("actions_s", {}).items():
            module = LETTER_MODULE.get(action[:1], action)
            per[module] = per.get(module, 0.0) + v[i]
        phases[rank] = per
    return Prediction("semu", terms, phases)


def plan_terms(loads: Mapping[str, Sequence[float]], ranks: Sequence[int],
               per_phase_sync: bool, scale: float) -> Prediction:  # fmt: skip
    """A plan's loads as terms: compute, and the waits they imply (each phase synchronised by
    its exchange when ``per_phase_sync``, else the whole step by the gradient reduction).

    Args:
        loads: per phase, each rank's load.
        ranks: the global rank of each load.
        per_phase_sync: the per-phase balanced step (the exchanges end each phase).
        scale: seconds per unit of load.
    """
    terms, phases = {}, {}
    totals = [sum(v[i] for v in loads.values()) * scale for i in range(len(ranks))]
    for i, rank in enumerate(ranks):
        if per_phase_sync:
            wait = sum((max(v) - v[i]) * scale for v in loads.values())
        else:
            wait = max(totals) - totals[i]
        terms[rank] = {name: None for name in TERMS}
        terms[rank].update({"compute": totals[i], "collective waits": wait})
        phases[rank] = {p: v[i] * scale for p, v in loads.items()}
    return Prediction("plan", terms, phases)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass
class RunSummary:
    """A run's terms and phases per rank, measured and predicted, averaged over iterations."""

    name: str
    iterations: list[int]
    ranks: list[int]
    measured: dict[int, dict[str, float]]
    predicted: dict[int, dict[str, float | None]]
    measured_phases: dict[int, dict[str, float]]
    predicted_phases: dict[int, dict[str, float]]
    host: dict[int, dict[str, float]]
    source: str
    note: str = ""
    plan_scale: float | None = None
    """Seconds per FLOP a FLOP plan was put in seconds at."""

    def step(self, which: str) -> float | None:
        """Mean over ranks of the terms' sum (None if nothing is predicted)."""
        table = self.measured if which == "measured" else self.predicted
        sums = [
            sum(v for v in table[r].values() if v is not None) for r in self.ranks if r in table
        ]
        return _mean(sums) if sums else None


def _average(tables: Sequence[Mapping[int, Mapping[str, float | None]]],
             select: Mapping[int, Sequence[int]] | None = None,
             absent: float | None = None) -> dict:  # fmt: skip
    """Per rank, the mean of each term over the tables (iterations) that have the rank, or over
    ``select[rank]``'s tables where given. A term missing from some of them counts as
    ``absent`` there: 0 for measured timers (a timer that did not run in an iteration, as
    ``plan`` where the plan was made ahead), None for predictions (the mean is None)."""
    out: dict[int, dict[str, float | None]] = {}
    for rank in sorted({r for t in tables for r in t}):
        chosen = [tables[i] for i in select[rank]] if select and rank in select else tables
        keys = dict.fromkeys(k for t in chosen for k in t.get(rank, {}))
        out[rank] = {}
        for k in keys:
            values = [t[rank].get(k, absent) for t in chosen if rank in t]
            out[rank][k] = None if any(v is None for v in values) else _mean(values)
    return out


def _predicted_iterations(records: Sequence[Mapping[str, Any]]) -> dict[int, list[int]] | None:
    """Per rank, the iterations (indices into ``records``) whose prediction has it, when the
    predicted ranks change from iteration to iteration (SEMU's step of every replica under
    megatron-core's engine: the prediction's ranks are the slowest replica's); else None.

    A rank's measured terms are then averaged over the iterations its replica was the
    predicted one, so that measured and predicted describe the same iterations."""
    ranks = {tuple(rec["prediction"]["ranks"]) for rec in records if "prediction" in rec}
    if len(ranks) <= 1:
        return None
    out: dict[int, list[int]] = {}
    for i, rec in enumerate(records):
        for rank in rec.get("prediction", {}).get("ranks", ()):
            out.setdefault(rank, []).append(i)
    return out


def summarize(name: str, records: Sequence[Mapping[str, Any]], skip: int,
              plan_scale: float | None = None,
              loads_key: str = "phases") -> RunSummary:  # fmt: skip
    """Average a run's iterations after ``skip`` warm-up ones.

    Args:
        name: what the run is called in the report.
        records: its per-iteration records.
        skip: warm-up iterations left out.
        plan_scale: seconds per FLOP for a FLOP plan (default: this run's measured rate).
        loads_key: ``phases`` (the plan's loads) or ``phases_before`` (Megatron's assignment).
    """
    records = list(records[skip:]) or list(records[-1:])
    world = len(records[0]["timers"]["iteration_s"])
    ranks = list(range(world))
    measured = [{r: measured_terms(rec["timers"], r) for r in ranks} for rec in records]
    m_phases = [{r: measured_phases(rec["timers"], r) for r in ranks} for rec in records]
    host = [{r: host_detail(rec["timers"], r) for r in ranks} for rec in records]
    predictions, note, source = [], "", "none"
    with_prediction = [rec for rec in records if "prediction" in rec]
    if with_prediction:
        first = with_prediction[0]["prediction"]
        source = first["source"]
        if source == "semu":
            predictions = [semu_terms(rec["prediction"]) for rec in with_prediction]
        else:
            scale = 1.0
            if first.get("unit") == "flops":
                if plan_scale is None:
                    flops = sum(sum(map(sum, rec["prediction"]["phases"].values()))
                                for rec in with_prediction)  # fmt: skip
                    seconds = sum(
                        measured[i][r]["compute"] for i in range(len(records)) for r in ranks
                    )
                    plan_scale = seconds / flops if flops else 0.0
                scale = plan_scale
                note = (f"the plan's loads are FLOPs, put in seconds at the measured "
                        f"{1 / scale / 1e9:.2f} GFLOP/s" if scale else "")  # fmt: skip
            per_phase = loads_key == "phases"
            predictions = [
                plan_terms(rec["prediction"][loads_key], rec["prediction"]["ranks"], per_phase, scale)
                for rec in with_prediction
            ]  # fmt: skip
            plan_scale = scale
    select = _predicted_iterations(records) if source == "semu" else None
    summary = RunSummary(
        name, [int(rec["iteration"]) for rec in records], ranks,
        _average(measured, select, absent=0.0),
        _average([p.terms for p in predictions]) if predictions else {},
        _average(m_phases, select, absent=0.0),
        _average([p.phases for p in predictions]) if predictions else {},
        _average(host, select, absent=0.0), source, note, plan_scale,
    )  # fmt: skip
    return summary


def summarize_pair(base_records: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]],
                   skip: int) -> tuple[RunSummary, RunSummary]:  # fmt: skip
    """A baseline (A) and a run (B) on the same data, each with its prediction. When B was
    balanced by a plan, A is predicted by the same plan's loads before balancing (the same
    samples left where they were loaded), at the same FLOP rate, as the metadata's ideal gain
    compares them."""
    b = summarize("B", records, skip)
    if b.source == "plan" and all("phases_before" in r.get("prediction", {}) for r in records):
        by_iteration = {r["iteration"]: r["prediction"] for r in records}
        base_records = [
            {**r, "prediction": by_iteration[r["iteration"]]}
            for r in base_records
            if r["iteration"] in by_iteration
        ]
        return summarize("A", base_records, skip, b.plan_scale, loads_key="phases_before"), b
    return summarize("A", base_records, skip), b


# --------------------------------------------------------------------------------------------
# The report


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _gap(measured: float, predicted: float | None) -> float:
    return measured - (predicted or 0.0)


def _verdict(source: str, term: str, measured: float, predicted: float | None) -> str:
    if predicted is None:
        return "not predicted"
    by = PREDICTED_BY.get(source, {}).get(term, source)
    if predicted <= 0:
        return f"none predicted by {by}" if measured > 5e-4 else ""
    ratio = measured / predicted
    return f"{by} {'under' if ratio > 1 else 'over'}estimates: measured {ratio:.2f}x"


def compute_calibration_note(s: RunSummary) -> str | None:
    """Whether the compute errors are one factor (the host runs at another speed than when
    calibrated) or differ by phase (the cost model's relative costs are off)."""
    ratios = {
        (phase, r): m / p
        for r in s.ranks
        for phase, m in s.measured_phases.get(r, {}).items()
        if (p := s.predicted_phases.get(r, {}).get(phase)) and m > 0
    }
    if len(ratios) < 2:
        return None
    lo, hi = min(ratios.values()), max(ratios.values())
    if hi / lo <= 1.25:
        return (f"compute measured/predicted is one factor, {lo:.2f}-{hi:.2f}x over ranks and "
                f"phases: this host runs at another speed than the cost model assumes "
                f"(refresh the layer tables in a minute: orchweave-calibrate --stages layers "
                f"--base CALIBRATION --output NEW)")  # fmt: skip
    (p_lo, r_lo), (p_hi, r_hi) = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
    return (f"compute measured/predicted differs by phase, {lo:.2f}x ({p_lo}, rank {r_lo}) to "
            f"{hi:.2f}x ({p_hi}, rank {r_hi}): the cost model's relative costs of the phases "
            f"are off, so its balance or schedule is built on wrong weights")  # fmt: skip


def format_run(s: RunSummary, top: int = 12) -> list[str]:
    """The report of one run."""
    first, last = s.iterations[0], s.iterations[-1]
    lines = [f"{s.name}: iterations {first}-{last} (mean of {len(s.iterations)}), "
             f"prediction: {s.source}" + (f" ({s.note})" if s.note else "")]  # fmt: skip
    measured, predicted = s.step("measured"), s.step("predicted")
    line = f"  step (mean over ranks): measured {_ms(measured)} ms"
    if predicted is not None:
        kind = "compute and waits only" if s.source == "plan" else "the whole step"
        line += f", predicted {_ms(predicted)} ms ({kind}; measured/predicted {measured / predicted:.2f})"
    lines.append(line)
    rows = []
    for r in s.ranks:
        for term in TERMS:
            m = s.measured[r][term]
            p = s.predicted.get(r, {}).get(term) if s.predicted else None
            rows.append((abs(_gap(m, p)), term, r, m, p))
    rows.sort(key=lambda x: -x[0])
    lines.append("  where the step went, per rank (ms per iteration), largest discrepancy first:")
    lines.append(
        f"    {'term':17s} {'rank':>4s} {'measured':>9s} {'predicted':>9s} {'gap':>8s}  explained by"
    )
    for _, term, r, m, p in rows[:top]:
        gap = f"{_gap(m, p) * 1e3:+8.1f}" if p is not None else f"{'':>8s}"
        lines.append(
            f"    {term:17s} {r:4d} {_ms(m):>9s} {_ms(p):>9s} {gap}  {_verdict(s.source, term, m, p)}"
        )
    for r in s.ranks:
        parts = sorted(s.host[r].items(), key=lambda kv: -kv[1])
        lines.append(
            f"    host on rank {r}: " + ", ".join(f"{k} {_ms(v)}" for k, v in parts if v > 5e-5)
        )
    note = compute_calibration_note(s)
    if note:
        lines.append("  " + note)
    rows = []
    for r in s.ranks:
        for phase, m in s.measured_phases.get(r, {}).items():
            p = s.predicted_phases.get(r, {}).get(phase)
            rows.append((abs(_gap(m, p)), phase, r, m, p))
    if rows:
        rows.sort(key=lambda x: -x[0])
        lines.append("  compute per rank and phase (ms per iteration), largest discrepancy first:")
        lines.append(
            f"    {'phase':8s} {'rank':>4s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}"
        )
        for _, phase, r, m, p in rows[:top]:
            ratio = f"{m / p:6.2f}" if p else f"{'-':>6s}"
            lines.append(f"    {phase:8s} {r:4d} {_ms(m):>9s} {_ms(p):>9s} {ratio}")
    return lines


def _mean_over_ranks(table: Mapping[int, Mapping[str, float | None]], term: str) -> float | None:
    values = [table[r].get(term) for r in table]
    return None if not values or any(v is None for v in values) else _mean(values)


def format_comparison(a: RunSummary, b: RunSummary) -> list[str]:
    """Where the predicted gain of ``b`` over ``a`` went: per term (mean over ranks), the
    predicted and the measured change; largest difference first."""
    lines = [f"{b.name} against {a.name}: per term, mean over ranks, ms per iteration"]
    lines.append(f"    {'term':17s} {'pred A':>8s} {'pred B':>8s} {'pred Δ':>8s} "
                 f"{'meas A':>8s} {'meas B':>8s} {'meas Δ':>8s} {'Δ gap':>8s}")  # fmt: skip
    rows = []
    for term in TERMS:
        pa, pb = _mean_over_ranks(a.predicted, term), _mean_over_ranks(b.predicted, term)
        ma, mb = _mean_over_ranks(a.measured, term), _mean_over_ranks(b.measured, term)
        pd = None if pa is None or pb is None else pb - pa
        rows.append((abs((mb - ma) - (pd or 0.0)), term, pa, pb, pd, ma, mb))
    rows.sort(key=lambda x: -x[0])
    for gap, term, pa, pb, pd, ma, mb in rows:
        lines.append(f"    {term:17s} {_ms(pa):>8s} {_ms(pb):>8s} {_ms(pd):>8s} {_ms(ma):>8s} "
                     f"{_ms(mb):>8s} {_ms(mb - ma):>8s} {_ms((mb - ma) - (pd or 0.0)):>8s}")  # fmt: skip
    pa, pb = a.step("predicted"), b.step("predicted")
    ma, mb = a.step("measured"), b.step("measured")
    lines.append(f"    {'step':17s} {_ms(pa):>8s} {_ms(pb):>8s} {_ms(None if pa is None or pb is None else pb - pa):>8s} "
                 f"{_ms(ma):>8s} {_ms(mb):>8s} {_ms(mb - ma):>8s}")  # fmt: skip
    if pa and pb:
        lines.append(f"  predicted gain {pa / pb:.3f} ({a.source} A, {b.source} B), measured gain "
                     f"{ma / mb:.3f}")  # fmt: skip
        saved = pa - pb
        for _, term, _, _, pd, ma_t, mb_t in rows[:3]:
            measured_d = mb_t - ma_t
            if pd is None:
                lines.append(f"  {term}: not predicted, measured {measured_d * 1e3:+.1f} ms")
                continue
            miss = measured_d - pd
            share = f", {abs(miss) / abs(saved):.0%} of the predicted change" if saved else ""
            lines.append(f"  {term}: predicted {pd * 1e3:+.1f} ms, measured {measured_d * 1e3:+.1f} "
                         f"ms: {miss * 1e3:+.1f} ms off{share}")  # fmt: skip
    return lines
