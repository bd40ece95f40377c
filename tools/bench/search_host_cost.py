#!/usr/bin/env python3
# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the schedule search running beside it costs a step's thread: search in a thread of
the step's process, or in a process of its own (``SearchInWorker``, what the trainer runs).

The step stand-in is one thread running a small MLP's forward and backward in torch (one
intra-op thread): many short operators, each of which releases the interpreter lock while it
runs, as a GPU step's kernel launches do. It runs for ``--seconds`` of wall time in each of three
arms, interleaved round after round on the same batches:

- ``alone``: nothing else runs;
- ``thread``: the CPU main job's searcher (PP=2, ``--pipeline-schedule dynamic``, 48 rollouts)
  searches its batches back to back in a thread of this process, as the trainer's search did
  before it moved to a process;
- ``process``: the same searches in the search's worker process, a background thread of this
  process waiting on the pipe, as the trainer runs them now.

Each round prints the arms' milliseconds per step iteration and their slowdown over ``alone``;
then the median and spread over the rounds, and the searches done per second in each arm. On a
host with a core to spare (this one has 2: the step takes one), the process leaves the step its
core; a thread takes the step's interpreter lock from it. Where every core computes (the CPU
main job: 2 ranks on 2 cores) neither arm is free: ``tools/bench/pipeline_cpu.py`` measures
that case.

Usage: python tools/bench/search_host_cost.py [--rounds 5] [--seconds 3]

Ends with ``search_thread_over_process_slowdown: X``: the thread arm's median slowdown of the
step over the process arm's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch

from megatron.mllm.config_files import load_run_config, set_flags
from megatron.mllm.steps.schedule_ahead import trainer_search
from pipeweaver.search.batch_search import SearchInWorker
from pipeweaver.semu.scenario import build_step

ARMS = ("alone", "thread", "process")


def step_stand_in(seconds: float) -> float:
    """Seconds per iteration of a small MLP's forward and backward (short operators), run
    for about ``seconds`` of wall time (a slowed arm does fewer iterations, not more time)."""
    torch.manual_seed(0)
    layers = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    x = torch.randn(16, 64)
    start = time.perf_counter()
    iters, now = 0, start
    while now - start < seconds:
        layers.zero_grad(set_to_none=True)
        layers(x).square().mean().backward()
        iters += 1
        now = time.perf_counter()
    return (now - start) / iters


class Searching:
    """Searches ``batches`` round-robin, back to back, in a thread until stopped."""

    def __init__(self, search, batches):
        self.search, self.batches = search, batches
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.search(*self.batches[self.done % len(self.batches)])
            self.done += 1

    def __enter__(self):
        self._thread.start()
        time.sleep(0.2)  # the first search under way (the worker's start-up not timed)
        self.done, self.started = 0, time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.rate = self.done / (time.perf_counter() - self.started)
        self._stop.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="wall time per arm")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        print("error: --rounds must be >= 3 (one round says nothing on a drifting host)",
              file=sys.stderr)  # fmt: skip
        return 2
    torch.set_num_threads(1)
    flags = set_flags({"pipeline-model-parallel-size": 2, "pipeline-schedule": "dynamic"})
    loaded = load_run_config("cpu-main", flags, world_size=2)
    search = trainer_search(loaded.run, loaded.model, 2, None, budget_ms=60_000.0)
    batches = []
    for it in range(4):
        schedules, mbs, _ = build_step(
            loaded.semu, search.semu.cluster, schedule="dynamic", pad=False, iteration=it
        )
        batches.append((schedules[0].placement, schedules[0].structure, mbs[0]))
    worker = SearchInWorker(search, "this benchmark", timeout_s=120.0)
    worker(*batches[0])  # started, the searcher resident
    searchers = {"thread": search, "process": worker}
    ms = {arm: [] for arm in ARMS}
    rates = {arm: [] for arm in ARMS[1:]}
    step_stand_in(0.5)  # warm-up
    try:
        for r in range(args.rounds):
            for arm in ARMS:
                if arm == "alone":
                    ms[arm].append(1000 * step_stand_in(args.seconds))
                    continue
                with Searching(searchers[arm], batches) as s:
                    ms[arm].append(1000 * step_stand_in(args.seconds))
                rates[arm].append(s.rate)
            row = ", ".join(
                f"{arm} {ms[arm][-1]:.3f} ms ({ms[arm][-1] / ms['alone'][-1]:.3f}x)" for arm in ARMS
            )
            print(f"round {r + 1}: {row}", flush=True)
    finally:
        worker.close()
    print(f"\nstep stand-in: an 8-layer MLP (64 wide, batch 16), forward and backward, "
          f"{args.seconds:g} s per arm, {args.rounds} interleaved rounds; slowdown = the "
          f"arm's time over alone's in the same round")  # fmt: skip
    slow = {arm: [t / a for t, a in zip(ms[arm], ms["alone"])] for arm in ARMS[1:]}
    for arm in ARMS[1:]:
        print(f"{arm:8s} slowdown median {statistics.median(slow[arm]):.3f} "
              f"(min {min(slow[arm]):.3f}, max {max(slow[arm]):.3f}); searches per second "
              f"{statistics.median(rates[arm]):.1f}")  # fmt: skip
    over = [t / p for t, p in zip(slow["thread"], slow["process"])]
    print(f"thread over process, per round: {', '.join(f'{x:.3f}' for x in over)}")
    print(f"search_thread_over_process_slowdown: {statistics.median(over):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
