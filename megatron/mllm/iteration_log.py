# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the trainer reports after each iteration: the metrics record (``--metrics-jsonl``,
TensorBoard, wandb), every rank's timers, and Megatron's log line every ``--log-interval``.

Every rank's timers reach the last rank in one all-gather per log interval, not per iteration
(as Megatron-LM gathers its timers when it logs): each rank keeps its iterations'
:class:`~megatron.mllm.timers.RankTimes` until the log line, so the gather's cost is shared by
the interval's iterations. The records that carry timers are therefore written at each log line
(and at the end of training); without timers or predictions each record is written when its
iteration ends. With ``--step-prediction`` the last rank predicts the interval's iterations at
the log line too, before the gather: the other ranks wait for it there, never in an iteration.
"""

from __future__ import annotations

import time
from typing import Any

from megatron.mllm import distributed
from megatron.mllm.metrics import IntervalStats, format_log_line, write_metrics
from megatron.mllm.timers import RankTimes, TimerLog, iteration_record


class IterationLog:
    """One rank's share of the reporting (see the module docstring); ``add`` and ``flush`` are
    collective when timers are on."""

    def __init__(self, trainer):
        """Args:
        trainer: the :class:`~megatron.mllm.training.Trainer` whose iterations are reported.
        """
        self.trainer = trainer
        self.is_logger = distributed.global_rank() == distributed.world_size() - 1
        self.timed = bool(trainer.run.logger.timing_log_level)
        self.stats = IntervalStats()
        self.timer_log = TimerLog(trainer.timers.option)
        self.pending_times: list[RankTimes] = []
        """This rank's timers of the iterations since the last gather."""
        self.pending_records: list[dict[str, Any]] = []
        """The last rank's records of those iterations, waiting for their timers."""
        self.pending_inputs: list = []
        """With ``--step-prediction``, what each pending record's prediction needs."""
        self.overlong = {"truncated": 0, "dropped": 0}
        """Samples of every DP rank that ``--overlong-samples`` cut or skipped since the last
        log line (from the gathered metadata, so global on every rank)."""

    def add(self, result, start: float, seconds: float) -> None:
        """Account one iteration; at a log interval, report the interval."""
        tr, run = self.trainer, self.trainer.run
        m = tr.metrics(result)
        profiled = tr.profiler.active(tr.iteration - 1)
        spans = tr.timers.take() if tr.timers.level else []
        if self.timed:
            self.pending_times.append(RankTimes.of(spans, seconds))
        inputs = None
        if run.logging.step_prediction or (profiled and tr.profiler.writes):
            inputs = tr.step_inputs()
        if profiled:
            actions = tr.schedule_actions()
            tr.profiler.end(tr.iteration, start, seconds, spans, actions, inputs)
        self.overlong["truncated"] += result.batch.truncated_samples
        self.overlong["dropped"] += result.batch.dropped_samples
        balanced = tr.step.balance_stats
        self.stats.add(
            seconds, m["samples"], m["tokens"], m["flops"], m["imbalance"],
            None if balanced is None else (balanced.imbalance_after or m["imbalance"]),
            0 if balanced is None else balanced.bytes_moved,
        )  # fmt: skip
        if self.is_logger and (run.logging.metrics_jsonl or tr.writers.active):
            record = {
                "iteration": tr.iteration,
                "lm_loss": result.loss,
                "iteration_time_s": seconds,
                "grad_norm": result.grad_norm,
                "learning_rate": tr.optimizer.param_groups[0]["lr"],
                **m,
            }
            if run.workload.overlong_samples != "error":
                record["truncated_samples"] = result.batch.truncated_samples
                record["dropped_samples"] = result.batch.dropped_samples
            self.pending_records.append(record)
            if run.logging.step_prediction:
                self.pending_inputs.append(inputs)
        if not self.timed:  # (--step-prediction needs timers: its records wait too)
            self._write_records()
        if tr.iteration % run.logger.log_interval == 0:
            self.flush()
            if self.is_logger:
                self._print_line(result)

    def flush(self) -> None:
        """Predict the pending iterations (last rank), gather the pending timers (collective)
        and write the pending records."""
        predictor = self.trainer.predictor
        for record, inputs in zip(self.pending_records, self.pending_inputs):
            if inputs is not None:
                record["prediction"] = predictor.predict_iteration(inputs).record()
        self.pending_inputs = []
        if self.timed and self.pending_times:
            start = time.perf_counter()
            gathered = distributed.all_gather_objects(self.pending_times)
            offsets = self.trainer.clock_offsets
            timers = [iteration_record([rank[i] for rank in gathered], offsets)
                      for i in range(len(self.pending_times))]  # fmt: skip
            # The timers' cost outside the iterations, shared by the interval's iterations.
            share = (time.perf_counter() - start) / len(timers)
            for t in timers:
                t["gather_s"] = share
                self.timer_log.add(t)
            for record, t in zip(self.pending_records, timers):
                record["timers"] = t
            self.pending_times = []
        self._write_records()

    def _write_records(self) -> None:
        tr, path = self.trainer, self.trainer.run.logging.metrics_jsonl
        for record in self.pending_records:
            if path:
                write_metrics(path, record)
            tr.writers.write(record["iteration"], record)
        self.pending_records = []

    def _print_line(self, result) -> None:
        tr, run = self.trainer, self.trainer.run
        gbs = run.global_batch_size
        line = format_log_line(
            tr.iteration, run.training.train_iters, tr.iteration * gbs, self.stats,
            distributed.world_size(), tr.optimizer.param_groups[0]["lr"], gbs, result.loss,
            result.grad_norm,
        )  # fmt: skip
        note = tr.step.log_note()
        if note:
            line += f" {note} |"
        policy = run.workload.overlong_samples
        if policy != "error":  # Megatron's style, like its "number of skipped iterations"
            done = "truncated" if policy == "truncate" else "dropped"
            line += f" {done} samples: {self.overlong[done]} |"
        self.overlong = {"truncated": 0, "dropped": 0}
        if self.timed:
            line += "\n" + self.timer_log.format()
            self.timer_log = TimerLog(tr.timers.option)
        print(line, flush=True)
        tr.memory_history.dump()
        self.stats = IntervalStats()
