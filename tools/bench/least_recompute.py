# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A ``tools/semu.py`` step as a user who must fit the device's memory runs it: no recompute if
that fits, else Megatron's block recompute of each chunk's first N layers with the least N that
fits (``pipeweaver.search.ablation.least_fitting``, a bisection), else a last resort. Shared by
``paper_tables.py``'s Megatron rows and ``omni84b_full_mode.py``'s fitted cases."""

from __future__ import annotations

from typing import Callable

from pipeweaver.search.ablation import least_fitting


def block_recompute(n: int) -> list[str]:
    """Megatron's block recompute of each chunk's first ``n`` layers (the rest keep their
    activations), as ``tools/semu.py`` flags."""
    return ["--set", "recompute-granularity=full", "--set", "recompute-method=block", "--set",
            f"recompute-num-layers={n}"]  # fmt: skip


def fit_recompute(
    simulate: Callable[[list[str]], dict], argv: list[str], most: int, last_resort: list[str]
) -> tuple[dict, list[str]]:
    """``simulate(argv)`` with the least recompute that fits, and the argv that gave it.

    Args:
        simulate: argv -> the ``tools/semu.py --json`` object (``over_memory_ranks`` empty: it
            fits).
        argv: the step without recompute.
        most: the most layers per chunk block recompute may take.
        last_resort: flags appended when even ``most`` does not fit (kept whether or not it
            fits then).
    """
    got = simulate(argv)
    if not got.get("over_memory_ranks"):
        return got, argv
    runs: dict[int, dict] = {}

    def fits(n: int) -> bool:
        runs[n] = simulate([*argv, *block_recompute(n)])
        return not runs[n].get("over_memory_ranks")

    n = least_fitting(fits, most)
    if n is not None:
        return runs[n], [*argv, *block_recompute(n)]
    tried = [*argv, *last_resort]
    return simulate(tried), tried
