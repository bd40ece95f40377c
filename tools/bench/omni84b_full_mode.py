# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchWeave's full mode against Megatron on the 84B three-modality model on 2,560 H100 (SEMU).

Usage (from the repository root)::

    python tools/bench/omni84b_full_mode.py [--cases NAME ...] [--iteration 0]

Each case is one ``tools/semu.py`` command line on ``scripts/configs/omni-84b.json`` and
``h100-2560.json`` (their assumptions are listed in the config). A case marked to fit
(:data:`FIT_RECOMPUTE`) recomputes as little as fits 80 GB, as a user who must fit the memory
runs it: no recompute if that fits, else Megatron's block recompute of each chunk's first N
layers with the least N that fits (``least_recompute.py``, a bisection: memory falls as N
grows), else every layer recomputed. Prints per case the step, MFU, the largest peak memory per
GPU and whether it fits, the recompute used, the speed-up over the strong Megatron baseline
(packed, parameter-balanced, overlapped reduction, the least recompute that fits), how long
SEMU took for the case (``semu s``: every ``tools/semu.py`` run of the case in this process,
from cold data-flow caches, the recompute's bisection included), and OrchMLLM's published
41.6% MFU and 3.1x beside
(arXiv 2503.23830 abstract; docs/architecture.md [1]). Ends with
``omni84b_full_mode_speedup: X`` (the fastest OrchWeave case that fits, over the strong
baseline). About two minutes for all cases (the two dynamic-pipeline cases and FSDP at 32
microbatches per rank take most). The PP=1 cases with FSDP (``--data-parallel-sharding-strategy``)
are SEMU's model of Megatron-FSDP (:mod:`pipeweaver.semu.fsdp_comm`), the HSDP one with Megatron's
``--num-distributed-optimizer-instances`` (:mod:`pipeweaver.semu.dp_groups`): the trainer refuses
both.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time

from least_recompute import fit_recompute

from megatron.mllm.cli import semu as semu_cli
from pipeweaver.dataflow import clear_flow_caches

PAPER_MFU = 0.416
"""OrchMLLM's MFU on the 84B model on 2,560 H100 (abstract)."""

PAPER_SPEEDUP = 3.1
"""OrchMLLM's best throughput over Megatron-LM (abstract: "up to 3.1x")."""

STRONG = "megatron-packed-strong"
"""The strong Megatron baseline the speed-ups are over."""

FIT_RECOMPUTE = {
    STRONG,
    "orchweave-pp4-dynamic-recompute",
    "orchweave-pp1-per-phase-mb32-recompute",
    "orchweave-pp1-per-phase-fsdp-mb32-recompute",
    "orchweave-pp1-per-phase-hsdp-mb32-recompute",
}
"""Cases run with the least recompute that fits 80 GB (:func:`run_case`)."""

DEEPEST_BLOCK = 80
"""The most layers a chunk of the 84B model holds (its LLM's, whole at PP = 1): block recompute
of more layers than that recomputes the same."""

HSDP = "orchweave-pp1-per-phase-hsdp-mb32-recompute"
"""OrchWeave's fastest case that fits (paper_tables' OrchMLLM row)."""

PP1 = ["--set", "pipeline-model-parallel-size=1", "--post-balance", "auto"]
"""OrchWeave's per-phase mode (OrchMLLM's setting): PP = 1, every phase balanced over DP."""

OVERLAP = ["--overlap-grad-reduce"]
"""Megatron's overlapped DP reduction, which the trainer runs in every mode (as the Megatron
cases do; Megatron-FSDP overlaps its own per-layer collectives)."""

LAYER_RC = ["--set", "recompute-granularity=full", "--set", "recompute-method=uniform", "--set",
            "recompute-num-layers=1"]  # fmt: skip
"""Megatron's per-layer full recompute (each layer's input kept, its forward rerun): what a case
that fits with no block recompute falls back to."""


CASES = {
    "megatron-padded": ["--overlap-grad-reduce"],
    "megatron-packed": ["--pad", "packed", "--overlap-grad-reduce"],
    STRONG: ["--pad", "packed", "--placement", "balanced", "--overlap-grad-reduce"],
    "orchweave-pp4-dynamic": ["--post-balance", "auto", "--schedule", "dynamic", "--pad", "none",
                              *OVERLAP],  # fmt: skip
    "orchweave-pp4-dynamic-recompute": ["--post-balance", "auto", "--schedule", "dynamic", "--pad",
                                        "none", *OVERLAP],  # fmt: skip
    "orchweave-pp1-per-phase": [*PP1, *OVERLAP],
    "orchweave-pp1-per-phase-fsdp": [*PP1, "--data-parallel-sharding-strategy",
                                     "optim_grads_params"],  # fmt: skip
    "orchweave-pp1-per-phase-mb32-recompute": [*PP1, "--set", "micro-batch-size=32", *OVERLAP],
    "orchweave-pp1-per-phase-fsdp-mb32-recompute": [
        *PP1, "--data-parallel-sharding-strategy", "optim_grads_params", "--set",
        "micro-batch-size=32",
    ],  # fmt: skip
    # HSDP: the same sharded within 10 groups of 32 DP ranks, each group a copy: every ring 31
    # steps instead of 319 (the flag's best from 2 to 80 instances in SEMU: 5-20 within 0.3%).
    HSDP: [
        *PP1, "--data-parallel-sharding-strategy", "optim_grads_params", "--set",
        "num-distributed-optimizer-instances=10", "--set", "micro-batch-size=32",
    ],  # fmt: skip
}
"""Case -> the flags after ``--model omni-84b --cluster h100-2560``."""


def simulate(flags: list[str], iteration: int) -> dict:
    """One case's ``tools/semu.py --json`` object.

    Raises:
        RuntimeError: the command failed (its ``error:`` line).
    """
    out, err = io.StringIO(), io.StringIO()
    argv = ["--model", "omni-84b", "--cluster", "h100-2560", "--json", "--iteration",
            str(iteration), *flags]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = semu_cli.main(argv)
    if status != 0:
        raise RuntimeError(err.getvalue().strip())
    return json.loads(out.getvalue())


def run_case(name: str, iteration: int) -> tuple[dict, list[str]]:
    """One case's ``tools/semu.py --json`` object and the flags that gave it: for a case in
    :data:`FIT_RECOMPUTE`, the least recompute that fits (the module's docstring), every run
    from cold caches."""
    if name not in FIT_RECOMPUTE:
        return simulate(CASES[name], iteration), CASES[name]

    def cold(flags: list[str]) -> dict:
        clear_flow_caches()
        return simulate(flags, iteration)

    return fit_recompute(cold, CASES[name], DEEPEST_BLOCK, LAYER_RC)


def recompute_of(flags: list[str]) -> str:
    """The recompute in ``flags``, in a few words."""
    settings = dict(f.split("=", 1) for f in flags if "=" in f)
    if "recompute-granularity" not in settings and "--memory" not in flags:
        return "none"
    if settings.get("recompute-method") == "block":
        return f"block {settings['recompute-num-layers']}"
    if settings.get("recompute-method") == "uniform":
        return "every layer"
    return "every chunk"


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print the table and the closing figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--iteration", type=int, default=0)
    args = parser.parse_args(argv)
    cases = list(dict.fromkeys([STRONG, *args.cases]))
    got, used, seconds = {}, {}, {}
    for name in cases:
        clear_flow_caches()
        t0 = time.perf_counter()
        got[name], used[name] = run_case(name, args.iteration)
        seconds[name] = time.perf_counter() - t0
    base = got[STRONG]["step_time_s"]
    w = max(34, *(len(n) for n in cases))
    print(
        f"{'case':<{w}} {'step s':>8} {'MFU':>7} {'peak GiB':>9} {'fits':>5} {'recompute':>11} "
        f"{'speed-up':>9} {'semu s':>7}"
    )
    best = 0.0
    for name in cases:
        r = got[name]
        peak = max(r["peak_memory_bytes"]) / 2**30
        fits = not r["over_memory_ranks"]
        speedup = base / r["step_time_s"]
        if name.startswith("orchweave") and fits:
            best = max(best, speedup)
        print(f"{name:<{w}} {r['step_time_s']:>8.3f} {r['mfu']:>7.1%} {peak:>9.1f} "
              f"{'yes' if fits else 'no':>5} {recompute_of(used[name]):>11} {speedup:>8.2f}x "
              f"{seconds[name]:>7.2f}")  # fmt: skip
    print(
        f"{'OrchMLLM (paper)':<{w}} {'':>8} {PAPER_MFU:>7.1%} {'':>9} {'':>5} {'':>11} "
        f"{PAPER_SPEEDUP:>8.2f}x"
    )
    print(f"omni84b_full_mode_speedup: {best:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
