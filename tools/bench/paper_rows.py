# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The rows of ``paper_tables.py``: a published figure beside SEMU's, how its error is counted,
and the printed table (the simulations behind the rows are ``paper_tables.py``'s)."""

from __future__ import annotations

from dataclasses import dataclass

GLOBAL_BATCH_SPAN = (16, 128)
"""Plausible global batches (8192-token sequences: one to eight per GPU) of DIP's VLM-S runs on
16 GPUs, which Tables 4 and 5 do not give; their baseline rows count by :attr:`Row.span`."""


@dataclass(frozen=True, slots=True)
class Row:
    """One published figure and SEMU's."""

    label: str
    """What the row is (system and setting)."""

    source: str
    """Where the paper's figure is (paper, table)."""

    unit: str
    """``s`` (seconds per iteration), ``mfu`` (a fraction) or ``x`` (a ratio)."""

    paper: float | None
    """The paper's figure (None: only in a figure we could not read)."""

    semu: float | None = None
    """SEMU's figure (None: not matched; :attr:`note` says why)."""

    config: str = ""
    """The command behind SEMU's figure (empty: none yet)."""

    note: str = ""
    """Assumptions, or why the row is not matched."""

    baseline: bool = False
    """A Megatron-LM baseline row (counted in the closing line)."""

    span: tuple[float, float] | None = None
    """SEMU's figure at the two ends of the plausible range of what the paper leaves out (the
    global batch, :data:`GLOBAL_BATCH_SPAN`); the row is then counted by how far the paper's
    figure lies outside that range (0 inside it)."""

    bound: str = ""
    """``">="`` where the paper's figure is a lower bound of the true one (derived from an 'up
    to' claim), ``"<="`` an upper bound; the row is then counted by how far SEMU's figure lies
    on the wrong side of it (0 on the right side)."""

    @property
    def error_pct(self) -> float | None:
        """``100 * (semu - paper) / paper``; None when either is missing."""
        return error_pct(self.paper, self.semu)

    @property
    def counted_error_pct(self) -> float | None:
        """The error the closing line counts: :attr:`error_pct` for a point figure; for a
        :attr:`span`, the error of the range's nearer end (0 with the paper's figure inside);
        for a :attr:`bound`, the error beyond it (0 on its right side)."""
        err = self.error_pct
        if err is None:
            return None
        if self.span is not None:
            lo, hi = sorted(self.span)
            if lo <= self.paper <= hi:
                return 0.0
            return error_pct(self.paper, lo if self.paper < lo else hi)
        if self.bound == ">=":
            return min(err, 0.0)
        if self.bound == "<=":
            return max(err, 0.0)
        return err


def error_pct(paper: float | None, semu: float | None) -> float | None:
    """The relative error of SEMU's figure against the paper's, in percent."""
    if paper is None or semu is None or paper == 0:
        return None
    return 100.0 * (semu - paper) / paper


def worst_baseline_error(rows: list[Row]) -> float | None:
    """The largest |counted error| over the matched Megatron-baseline rows (None: none)."""
    errors = [abs(r.counted_error_pct) for r in rows if r.baseline and r.error_pct is not None]
    return max(errors) if errors else None


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "mfu":
        return f"{value:.1%}"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:.3f} s"


def format_rows(rows: list[Row]) -> list[str]:
    """The table: one line per row, then its config and its note, indented."""
    lines = [
        f"{'row':<58} {'source':<14} {'paper':>9} {'SEMU':>9} {'error':>8} {'counted':>8}  base"
    ]
    for r in rows:
        err, counted = r.error_pct, r.counted_error_pct
        lines.append(
            f"{r.label:<58} {r.source:<14} {r.bound + _fmt(r.paper, r.unit):>9} "
            f"{_fmt(r.semu, r.unit):>9} {'-' if err is None else f'{err:+.1f}%':>8} "
            f"{'-' if counted is None else f'{counted:+.1f}%':>8}  {'yes' if r.baseline else ''}"
        )
        lines.append(f"    config: {r.config or 'none'}")
        if r.span is not None:
            lo, hi = r.span
            lines.append(
                f"    range: SEMU {_fmt(lo, r.unit)} to {_fmt(hi, r.unit)} over global batch "
                f"{GLOBAL_BATCH_SPAN[0]} to {GLOBAL_BATCH_SPAN[1]} sequences (the paper gives "
                f"none); counted: the paper's figure {'inside' if counted == 0 else 'outside'}"
            )
        if r.note:
            lines.append(f"    note: {r.note}")
    return lines
