# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's profiling flags in OrchWeave's trainer, and the step timeline beside SEMU's.

Megatron's flags mean what they mean in Megatron-LM: ``--profile`` profiles the iterations
from ``--profile-step-start`` to ``--profile-step-end`` (the counts of iterations done before,
so 10 and 12 profile the 11th and 12th) on the ranks of ``--profile-ranks`` (all by default):
with nsys's CUDA profiler API, or, with ``--use-pytorch-profiler``, with ``torch.profiler``
(its Chrome trace goes to ``<--tensorboard-dir>/../torch_profile/rank-N.json.gz`` as in
Megatron-LM). ``--record-memory-history`` records CUDA allocations on the last rank and dumps
a snapshot to ``--memory-snapshot-path`` at each log line.

OrchWeave's ``--profile-trace FILE`` and ``--profile-png FILE`` add the step's timeline. In the
profiled iterations every rank times at level 2 (whatever ``--timing-log-level`` says), the
last rank predicts each iteration (SEMU, or the balance plan: ``megatron.mllm.prediction``),
and at the window's end one gather brings every rank's spans, its action list and its
``torch.profiler`` events to the last rank, which writes them with
:mod:`megatron.mllm.step_trace`.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import tempfile
import time
from pathlib import Path

import torch

from megatron.mllm import distributed
from megatron.mllm.prediction import PredictedIteration, StepInputs, StepPredictor
from megatron.mllm.step_trace import (
    ProfiledIteration,
    comparison,
    drawn_in_seconds,
    profile_trace,
    summary_lines,
    write_comparison_png,
)
from megatron.mllm.timers import RankTimes, Span, StepTimers, iteration_record

logger = logging.getLogger(__name__)

_MARK = "orchweave iteration {}"
"""The ``torch.profiler.record_function`` around each profiled iteration: it ties the profiler's
clock to the timers'."""


class StepProfiler:
    """One rank's share of the profile window (see the module docstring)."""

    def __init__(self, run, timers: StepTimers, rank: int, world: int):
        """Args:
        run: the :class:`~megatron.mllm.run_config.RunConfig`.
        timers: the trainer's timers, raised to level 2 in the window.
        rank: this process's global rank.
        world: the number of processes.
        """
        cfg, log = run.profiling, run.logging
        self.run = run
        self.timers = timers
        self.rank, self.world = rank, world
        self.on = bool(cfg.use_nsys_profiler)
        self.first, self.last = cfg.profile_step_start, cfg.profile_step_end
        here = self.on and (not cfg.profile_ranks or rank in cfg.profile_ranks)
        self.use_torch = here and cfg.use_pytorch_profiler
        self.use_nsys = here and not cfg.use_pytorch_profiler and torch.cuda.is_available()
        self.trace_path, self.png_path = log.profile_trace, log.profile_png
        self.collects = self.on and bool(self.trace_path or self.png_path)
        """Whether the window gathers every rank's spans for the trace or the PNG."""
        self.writes = self.collects and rank == world - 1
        self.records: list[ProfiledIteration] = []
        self.inputs: list[StepInputs] = []
        self.predictor: StepPredictor | None = None
        """Set by the trainer on the writing rank."""
        self._saved_level = timers.level
        self._torch = None
        self._mark = None
        self._mark_at = 0.0
        self._torch_dir = None
        if cfg.use_pytorch_profiler and run.logger.tensorboard_dir:
            self._torch_dir = Path(run.logger.tensorboard_dir).parent / "torch_profile"

    def active(self, done: int) -> bool:
        """Whether the iteration after ``done`` finished ones is profiled."""
        return self.on and self.first <= done < self.last

    def begin(self, done: int) -> None:
        """Before the iteration after ``done`` finished ones."""
        if not self.active(done):
            return
        if done == self.first:
            self._saved_level = self.timers.level
            if self.collects:
                self.timers.level = 2
            if self.use_torch:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                cfg = self.run.profiling
                self._torch = torch.profiler.profile(
                    activities=activities,
                    record_shapes=cfg.pytorch_profiler_collect_shapes,
                    with_stack=cfg.pytorch_profiler_collect_callstack,
                )
                self._torch.start()
            if self.use_nsys:
                torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStart())
        if self._torch is not None:
            self._mark = torch.profiler.record_function(_MARK.format(done + 1))
            self._mark.__enter__()
            self._mark_at = time.perf_counter()

    def end(self, done: int, start: float, seconds: float, spans: list[Span],
            actions: list[str] | None, inputs: StepInputs | None) -> None:  # fmt: skip
        """After the iteration that made ``done`` finished ones (collective at the window's
        end: every rank calls it).

        Args:
            done: iterations finished, this one included.
            start: when it started (``time.perf_counter``).
            seconds: how long it took.
            spans: this rank's timer spans of it.
            actions: this rank's runtime actions in schedule order, if it ran the runtime.
            inputs: what the last rank's prediction of it needs, if it predicts (the predictions
                run at the window's end, off the iterations).
        """
        if not self.active(done - 1):
            return
        if self._mark is not None:
            self._mark.__exit__(None, None, None)
            self._mark = None
        if self.collects:
            self.records.append(ProfiledIteration(done, start, seconds, spans, actions))
            if inputs is not None:
                self.inputs.append(inputs)
        if done == self.last:
            self._finish()

    def _finish(self) -> None:
        self.timers.level = self._saved_level
        if self.use_nsys:
            torch.cuda.check_error(torch.cuda.cudart().cudaProfilerStop())
        if self._torch is not None:
            self._torch.stop()
            events = self._torch_events()
            for record in self.records:
                record.torch_events = events.get(record.iteration, [])
            self._torch = None
        if not self.collects:
            return
        predictions = []
        if self.predictor is not None:
            predictions = [self.predictor.predict_iteration(i) for i in self.inputs]
        offsets = distributed.clock_offsets()
        gathered = distributed.all_gather_objects(self.records)
        if self.writes:
            self._write(gathered, offsets, predictions)
        self.records, self.inputs = [], []

    def _torch_events(self) -> dict[int, list[dict]]:
        """``torch.profiler``'s complete events per iteration, on this rank's clock."""
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            self._torch.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                trace = json.load(f)
        if self._torch_dir is not None:
            self._torch_dir.mkdir(parents=True, exist_ok=True)
            with gzip.open(self._torch_dir / f"rank-{self.rank}.json.gz", "wt") as f:
                json.dump(trace, f)
        events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
        marks = {
            int(e["name"].rsplit(" ", 1)[1]): e
            for e in events
            if e.get("name", "").startswith(_MARK.format(""))
        }
        if not marks:
            return {}
        # The profiler's clock has its own zero: the marks, opened a few microseconds before
        # each perf_counter reading, tie it to the timers' clock.
        last_mark = marks[max(marks)]
        shift_us = self._mark_at * 1e6 - last_mark["ts"]
        out: dict[int, list[dict]] = {}
        for e in events:
            ts = e["ts"] + shift_us
            for it, mark in marks.items():
                if mark["ts"] <= e["ts"] <= mark["ts"] + mark["dur"]:
                    out.setdefault(it, []).append({**e, "ts": ts})
                    break
        return out

    @staticmethod
    def _records(gathered: list[list[ProfiledIteration]], offsets: list[float],
                 predictions: list[PredictedIteration]) -> list:  # fmt: skip
        """The iterations as ``--metrics-jsonl`` records its timers and prediction (what
        ``orchweave-explain-step`` reads)."""
        predicted = {p.iteration: p.record() for p in predictions}
        out = []
        for i, it in enumerate(gathered[0]):
            times = [RankTimes.of(rank[i].spans, rank[i].seconds) for rank in gathered]
            record = {"iteration": it.iteration, "timers": iteration_record(times, offsets)}
            if it.iteration in predicted:
                record["prediction"] = predicted[it.iteration]
            out.append(record)
        return out

    def _write(self, gathered: list[list[ProfiledIteration]], offsets: list[float],
               predictions: list[PredictedIteration]) -> None:  # fmt: skip
        iterations = sorted({it.iteration for it in gathered[0]})
        predicted = {p.iteration: p for p in predictions}
        lines: list[str] = []
        for it in iterations:
            events, busy, measured_s = comparison(gathered, offsets, it)
            if it in predicted:
                predicted[it] = drawn_in_seconds(predicted[it], busy)
            lines = summary_lines(it, measured_s, busy, predicted.get(it))
            print("> profile: " + "\n> profile: ".join(lines), flush=True)
        if self.trace_path:
            trace = profile_trace(gathered, offsets, list(predicted.values()))
            trace["otherData"]["records"] = self._records(gathered, offsets, predictions)
            with open(self.trace_path, "w", encoding="utf-8") as f:
                json.dump(trace, f)
        if self.png_path:
            # The last profiled iteration: the first ones can still be warming up.
            write_comparison_png(self.png_path, events, predicted.get(iterations[-1]),
                                 self.world, lines)  # fmt: skip
        written = [p for p in (self.trace_path, self.png_path) if p]
        print(f"> profile: iterations {iterations[0]}-{iterations[-1]} of {self.world} ranks "
              f"written to {', '.join(written)}", flush=True)  # fmt: skip


class MemoryHistory:
    """``--record-memory-history``: CUDA's allocation history on the last rank, dumped to
    ``--memory-snapshot-path`` at each log line (as Megatron-LM)."""

    def __init__(self, run, rank: int, world: int):
        cfg = run.profiling
        self.path = cfg.memory_snapshot_path
        self.on = bool(cfg.record_memory_history) and rank == world - 1
        if self.on and not torch.cuda.is_available():
            print("warning: --record-memory-history records CUDA allocations; this run has no "
                  "CUDA device, so nothing is recorded", flush=True)  # fmt: skip
            self.on = False
        if self.on:
            torch.cuda.memory._record_memory_history(max_entries=100_000)

    def dump(self) -> None:
        """Write the snapshot (at a log line)."""
        if not self.on:
            return
        with open(self.path, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
