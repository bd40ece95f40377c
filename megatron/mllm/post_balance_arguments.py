# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The checks of batch post-balancing's flags (``--post-balance*``, ``--cost-fit*``), each a
ValueError whose message names the flag; ``megatron.mllm.arguments`` turns it into the
trainer's one ``error:`` line."""

from __future__ import annotations

import argparse

from orchestration.measured_guard import check_interval
from orchestration.workload import PHASES


def check_post_balance(args: argparse.Namespace) -> None:
    """Check the post-balance flags of ``args``.

    Raises:
        ValueError: naming the flag at fault and its value.
    """
    _check_caps(args)
    for flag in ("cost_fit_warmup", "cost_fit_window"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    check_interval(args.post_balance_guard_interval, "--post-balance-guard-interval")
    alt = args.post_balance_alternate
    if alt < 0:
        raise ValueError(f"--post-balance-alternate must be >= 0 (0: off), got {alt}")
    if alt and args.post_balance == "none":
        raise ValueError(
            f"--post-balance-alternate {alt} alternates balancing with Megatron's step: it needs "
            f"--post-balance lpt, kk or auto (got --post-balance {args.post_balance})"
        )
    if args.cost_fit_warmup > args.cost_fit_window:
        raise ValueError(
            f"--cost-fit-warmup {args.cost_fit_warmup} must not exceed --cost-fit-window "
            f"{args.cost_fit_window} (the fit starts once its window holds the warm-up's samples)"
        )


def _check_caps(args: argparse.Namespace) -> None:
    seen = set()
    for item in args.post_balance_token_caps:
        phase, _, value = item.partition("=")
        if phase not in PHASES or not value.isdigit() or int(value) < 1:
            raise ValueError(
                f"--post-balance-token-caps: expected PHASE=TOKENS with PHASE in "
                f"{', '.join(PHASES)} and TOKENS a positive integer, got {item!r}"
            )
        if phase in seen:
            raise ValueError(f"--post-balance-token-caps: {phase} is capped twice")
        seen.add(phase)
    if seen and args.post_balance == "none":
        raise ValueError(
            "--post-balance-token-caps caps what balancing gives a rank: it needs "
            "--post-balance (with --post-balance none nothing moves)"
        )
