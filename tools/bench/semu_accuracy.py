#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""SEMU's accuracy against real CPU trainer runs: step time and activation memory.

For each run of a list (PP = 1/2, DP = 1/2, the upstream-Megatron baseline schedules, three
workload specs), it

1. runs the main job (``scripts/pretrain_mllm_cpu.sh`` with overrides and ``--metrics-jsonl``)
   ``--repeats`` times and takes the median ``iteration_time_s`` of all the timed iterations
   (after ``--warmup`` in each). The repeats go round-robin over the list: this host's speed
   drifts by 10-30% over seconds (the same 12-iteration run of pp1-dp1-omni measured 493 to
   610 ms in four launches a few minutes apart), so one short run per configuration is a
   sample of the host's mood as much as of the configuration;
2. predicts every one of those iterations with SEMU, calibrated from ``--calibration`` (a
   ``tools/calibrate.py`` file measured on this machine), on the exact microbatches the trainer
   ran: the same samples (``orchestration.workload_spec.SampleStream`` with the run's seed and
   token scale), in Megatron's sampler order (``microbatch_indices``), packed and padded as
   ``megatron.mllm.batch`` does; the schedule is megatron-core's (no pipelining or 1F1B,
   encoders on stage 0), expressed in the IR;
3. with ``--memory``, runs the same configuration once more under
   ``tools/bench/semu_memory_probe.py`` (the trainer with ``saved_tensors_hooks`` counting the
   bytes autograd keeps alive) for its first ``--memory-iters`` iterations and compares each
   rank's peak with SEMU's predicted peak activation bytes of its pipeline rank over the same
   iterations (peaks are maxima over the batches seen: both sides must see the same ones).

Prints a table and the mean absolute error; ends with ``semu_mae_pct: X``.

Usage::

    python tools/bench/semu_accuracy.py --calibration cal.json [--iters 12] [--warmup 3]
        [--repeats 3] [--runs pp1-dp2-omni,pp2-dp1-omni,...] [--memory] [--smoke] [--no-progress]
        [--against other-cal.json]

``--against`` predicts the same measured iterations with a second calibration (one more column
and its mean absolute error): two calibrations compared on one set of runs, not two launches.

``--smoke`` runs one tiny world-size-1 configuration (4 iterations), for tests of the harness.
On a terminal, bars count the launches and SEMU's iterations on stderr.
Timings need a quiet machine: run the full list only when nothing else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from megatron.mllm.cli.launch import MAIN_JOB, REPO, free_port, torchrun_command
from megatron.mllm.cli.progress import add_no_progress_flag, echo, progress
from megatron.mllm.config_files import LoadedConfig, load_run_config, set_flags
from orchestration.calibration import Calibration
from orchestration.packing import microbatch_indices, padding_runs
from orchestration.workload_spec import SampleStream
from pipeweaver.generators import generate
from pipeweaver.placement import Placement
from pipeweaver.semu.batches import MicrobatchMeta, pack_microbatch, structure_of
from pipeweaver.semu.hardware import DEVICES, ClusterSpec
from pipeweaver.semu.model import ModelSpec
from pipeweaver.semu.simulator import Semu

BASE_CONFIG = "cpu-main"
"""The model config of the main job (``scripts/configs/cpu-main.json``)."""


@dataclass(frozen=True)
class Run:
    """One trainer run to compare against."""

    name: str
    """Identifier."""

    nproc: int
    """Processes (world size)."""

    pp: int
    """Pipeline-parallel size (DP = nproc / pp)."""

    workload: str
    """Workload spec."""

    extra: tuple[str, ...] = ()
    """More trainer flags."""

    @property
    def dp(self) -> int:
        return self.nproc // self.pp


RUNS = [
    Run("pp1-dp1-omni", 1, 1, "omni-three-modality"),
    Run("pp1-dp2-omni", 2, 1, "omni-three-modality"),
    Run("pp2-dp1-omni", 2, 2, "omni-three-modality"),
    Run("pp1-dp1-obelics", 1, 1, "obelics-interleaved"),
    Run("pp1-dp2-obelics", 2, 1, "obelics-interleaved"),
    Run("pp2-dp1-obelics", 2, 2, "obelics-interleaved"),
    Run("pp1-dp2-speech", 2, 1, "speech-asr-librispeech"),
    Run("pp2-dp1-speech", 2, 2, "speech-asr-librispeech"),
]
"""The default list: PP = 1/2, DP = 1/2, three workloads, 2 gloo ranks at most."""

SMOKE = Run(
    "smoke-pp1-dp1-omni",
    1,
    1,
    "omni-three-modality",
    ("--global-batch-size", "4", "--lr-warmup-iters", "1"),
)


@dataclass
class Outcome:
    """Measured and predicted figures of one run."""

    run: Run
    measured_s: list[float] = field(default_factory=list)
    predicted_s: list[float] = field(default_factory=list)
    measured_mem: list[float] = field(default_factory=list)
    predicted_mem: list[float] = field(default_factory=list)
    against_s: list[float] = field(default_factory=list)
    """The same iterations predicted with ``--against``'s calibration."""

    def _error(self, predicted_s: list[float]) -> float:
        m, p = statistics.median(self.measured_s), statistics.median(predicted_s)
        return abs(p - m) / m

    @property
    def time_error(self) -> float:
        return self._error(self.predicted_s)

    @property
    def against_error(self) -> float:
        return self._error(self.against_s)

    @property
    def memory_error(self) -> float | None:
        if not self.measured_mem:
            return None
        errs = [abs(p - m) / m for m, p in zip(self.measured_mem, self.predicted_mem) if m > 0]
        return max(errs) if errs else None


def run_config(run: Run) -> LoadedConfig:
    """The main job's config with the run's layout, workload and extra flags."""
    flags = set_flags({"pipeline-model-parallel-size": run.pp, "workload": run.workload})
    return load_run_config(BASE_CONFIG, [*flags, *run.extra], world_size=run.nproc)


def timing_run(run: Run, iters: int, workdir: Path) -> list[dict]:
    """Run the main job; return its per-iteration metrics."""
    metrics = workdir / f"{run.name}.jsonl"
    metrics.unlink(missing_ok=True)
    env = dict(
        os.environ, PYTHON=sys.executable, NPROC=str(run.nproc), MASTER_PORT=str(free_port())
    )
    env.setdefault("PYTHONWARNINGS", "ignore")
    cmd = [
        "bash",
        str(MAIN_JOB),
        # The upstream-Megatron baseline: the main job switches OrchWeave's features on.
        "--post-balance",
        "none",
        "--pipeline-schedule",
        "megatron",
        "--pipeline-model-parallel-size",
        str(run.pp),
        "--workload",
        run.workload,
        *run.extra,
        "--train-iters",
        str(iters),
        "--log-interval",
        str(iters),
        "--metrics-jsonl",
        str(metrics),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"error: run {run.name} failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def memory_run(run: Run, config: LoadedConfig, iters: int, workdir: Path) -> dict[int, float]:
    """Run the probe; return each process rank's peak saved bytes (max over iterations)."""
    out = workdir / f"{run.name}-memory"
    out.mkdir(exist_ok=True)
    for f in out.glob("*.jsonl"):
        f.unlink()
    env = dict(
        os.environ, SEMU_MEMORY_OUT=str(out), OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")
    )
    env.setdefault("PYTHONWARNINGS", "ignore")
    probe = REPO / "tools" / "bench" / "semu_memory_probe.py"
    # The iteration flags after the config's: the later of two equal flags wins.
    cmd = torchrun_command(run.nproc, [
        str(probe), "--distributed-backend", "gloo", "--transformer-impl", "local", "--lr", "1e-3",
        *config.argv, "--train-iters", str(iters), "--log-interval", str(iters)])  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"error: memory run {run.name} failed:\n{proc.stderr[-3000:]}")
    peaks = {}
    for f in out.glob("rank*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            peaks[rec["rank"]] = max(peaks.get(rec["rank"], 0.0), float(rec["peak_saved_bytes"]))
    return peaks


def trainer_microbatches(spec: ModelSpec, run: Run, iteration: int) -> list[list[MicrobatchMeta]]:
    """The microbatches the trainer ran at ``iteration`` (0-based), per DP rank.

    Uses the trainer's own data functions: the same sample stream and sampler order, and the
    trainer's padding rule (:mod:`orchestration.packing`).
    """
    t = spec.training
    source = SampleStream(t.workload, t.workload_seed, t.workload_token_scale)
    m = t.num_microbatches(run.dp)
    pad_to = t.seq_length * t.micro_batch_size if run.pp > 1 else None
    enc = list(spec.shape.encoders)
    out = []
    for d in range(run.dp):
        mbs = []
        for idx in microbatch_indices(iteration, d, run.dp, t.micro_batch_size, m):
            samples = [source.meta(k) for k in idx]
            mb = pack_microbatch(
                samples,
                enc,
                pad_to,
                t.seq_length,
                flops_of=lambda s: sum(spec.shape.sample_phase_flops(s).values()),
            )
            real = [s.llm_tokens for s in samples]
            expected = tuple(real + padding_runs(sum(real), pad_to, t.seq_length))
            if mb.llm_seq_lens != expected:
                raise RuntimeError(f"packing mismatch: {mb.llm_seq_lens} vs trainer {expected}")
            mbs.append(mb)
        out.append(mbs)
    return out


def predict(spec: ModelSpec, run: Run, cal: Calibration, iterations: list[int]):
    """SEMU's step time for each iteration, and the peak activation bytes per pipeline rank
    (maximum over the iterations)."""
    cluster = ClusterSpec(DEVICES["cpu"], run.nproc, devices_per_node=run.nproc, name="cpu")
    semu = Semu(spec, cluster, cal)
    placement = Placement.baseline(run.pp, spec.layers())
    schedule = "none" if run.pp == 1 else "1f1b"
    enc = list(spec.shape.encoders)
    times, mem = [], [0.0] * run.pp
    for it in progress(iterations, f"SEMU {run.name}", leave=False):
        mbs = trainer_microbatches(spec, run, it)
        scheds = [generate(schedule, placement, structure_of(x, enc)) for x in mbs]
        res = semu.simulate_step(scheds, mbs, record_events=False)
        times.append(res.step_time_s)
        mem = [max(a, b) for a, b in zip(mem, res.peak_activation_bytes)]
    return times, mem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--calibration", required=True, help="tools/calibrate.py output")
    parser.add_argument(
        "--against",
        help="a second calibration: its predictions of the same measured iterations beside",
    )
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--repeats", type=int, default=3, help="launches per run, round-robin over the runs"
    )
    parser.add_argument(
        "--memory-iters", type=int, default=4, help="iterations of the memory probe"
    )
    parser.add_argument("--runs", help="comma-separated run names (default: all)")
    parser.add_argument("--memory", action="store_true", help="also compare activation memory")
    parser.add_argument("--smoke", action="store_true", help="one tiny run (tests the harness)")
    parser.add_argument("--workdir", help="keep metrics files here")
    add_no_progress_flag(parser)
    args = parser.parse_args()
    cal = Calibration.load(args.calibration)
    against = Calibration.load(args.against) if args.against else None
    if args.smoke:
        runs, iters, warmup, args.repeats = [SMOKE], 4, 1, 1
    else:
        names = set(args.runs.split(",")) if args.runs else None
        runs = [r for r in RUNS if names is None or r.name in names]
        iters, warmup = args.iters, args.warmup
        if names and len(runs) != len(names):
            sys.exit(f"error: unknown runs {sorted(names - {r.name for r in RUNS})}")
    tmp = tempfile.TemporaryDirectory() if not args.workdir else None
    workdir = Path(args.workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    outcomes = {run.name: Outcome(run) for run in runs}
    configs = {run.name: run_config(run) for run in runs}
    launches = [(rep, run) for rep in range(args.repeats) for run in runs]
    for rep, run in progress(launches, "trainer runs"):
        o = outcomes[run.name]
        timed = timing_run(run, iters, workdir)[warmup:]
        o.measured_s += [r["iteration_time_s"] for r in timed]
        # Every launch runs the same iterations: predict them once.
        if rep == 0:
            o.predicted_s, _ = predict(
                configs[run.name].semu, run, cal, [r["iteration"] - 1 for r in timed]
            )
            if against is not None:
                o.against_s, _ = predict(
                    configs[run.name].semu, run, against, [r["iteration"] - 1 for r in timed]
                )
        echo(f"  {run.name} ({rep + 1}/{args.repeats}): measured "
             f"{statistics.median(r['iteration_time_s'] for r in timed) * 1e3:.1f} ms, "
             f"predicted {statistics.median(o.predicted_s) * 1e3:.1f} ms")  # fmt: skip
    if args.memory:
        for run in progress(runs, "memory runs"):
            o = outcomes[run.name]
            mem_iters = min(iters, args.memory_iters)
            peaks = memory_run(run, configs[run.name], mem_iters, workdir)
            _, mem = predict(configs[run.name].semu, run, cal, list(range(mem_iters)))
            # Process rank -> pipeline rank: PP is the outer dimension (rank = dp + DP * pp).
            by_pp = [0.0] * run.pp
            for rank, peak in peaks.items():
                by_pp[rank // run.dp] = max(by_pp[rank // run.dp], peak)
            o.measured_mem, o.predicted_mem = by_pp, mem
    outcomes = list(outcomes.values())
    print(f"SEMU accuracy on {cal.device} (calibration: {cal.source})")
    print(
        f"{'run':22s} {'PP':>2s} {'DP':>2s} {'workload':24s} {'measured ms':>11s} "
        f"{'predicted ms':>12s} {'error':>7s}   activations measured / predicted (per PP rank)"
    )
    for o in outcomes:
        r = o.run
        line = (
            f"{r.name:22s} {r.pp:2d} {r.dp:2d} {r.workload:24s} "
            f"{statistics.median(o.measured_s) * 1e3:11.1f} "
            f"{statistics.median(o.predicted_s) * 1e3:12.1f} {o.time_error:7.1%}"
        )
        if against is not None:
            line += (
                f"   against: {statistics.median(o.against_s) * 1e3:.1f} ms {o.against_error:.1%}"
            )
        if o.measured_mem:
            pairs = ", ".join(
                f"{m / 2**20:.2f}/{p / 2**20:.2f} MiB"
                for m, p in zip(o.measured_mem, o.predicted_mem)
            )
            line += f"   {pairs} (max error {o.memory_error:.1%})"
        print(line)
    if against is not None:
        print(f"against {args.against} ({against.source[:60]}...): mean absolute error "
              f"{statistics.mean(o.against_error for o in outcomes):.1%}")  # fmt: skip
    mae = statistics.mean(o.time_error for o in outcomes)
    worst = max(outcomes, key=lambda o: o.time_error)
    print(f"mean absolute error {mae:.1%}; worst {worst.run.name} {worst.time_error:.1%}")
    mem_errs = [o.memory_error for o in outcomes if o.memory_error is not None]
    if mem_errs:
        print(f"semu_memory_max_error_pct: {100 * max(mem_errs):.1f}")
    print(f"semu_mae_pct: {100 * mae:.1f}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
