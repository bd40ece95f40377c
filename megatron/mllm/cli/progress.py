# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Progress bars of the long-running tools: tqdm on stderr, only on a terminal.

:func:`progress` wraps an iterable in a bar when stderr is a terminal and returns it unchanged
otherwise (a pipe, a file, a test's captured output), so that what a tool prints to stdout is
the same, byte for byte, with or without bars. Bars are also off with a tool's
``--no-progress`` (:func:`add_no_progress_flag`) or with ``ORCHWEAVE_PROGRESS=0`` in the
environment (the test suite sets it), and a bar is drawn only once its loop has run for
:data:`DELAY_S` seconds, so quick loops never draw one.

While a bar may be on the terminal, a tool prints its lines with :func:`echo`: it clears the
bars, writes the line (the same bytes as ``print``) and draws them again.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterable, TextIO, TypeVar

T = TypeVar("T")

DELAY_S = 1.0
"""Seconds a loop runs before its bar appears."""

ENV = "ORCHWEAVE_PROGRESS"
"""``ORCHWEAVE_PROGRESS=0`` switches every bar off."""

_enabled = True


def set_enabled(on: bool) -> None:
    """Switch the bars of this process on (the default: on a terminal) or off."""
    global _enabled
    _enabled = on


def enabled() -> bool:
    """Whether a bar would be drawn now: on, not off by the environment, stderr a terminal."""
    if not _enabled or os.environ.get(ENV, "1") == "0":
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress(
    iterable: Iterable[T], desc: str, total: int | None = None, *, leave: bool = True
) -> Iterable[T]:
    """``iterable`` with a tqdm bar on stderr when :func:`enabled`, else ``iterable`` itself.

    Args:
        iterable: what the loop runs over.
        desc: the bar's label, e.g. ``"layers"``.
        total: its length, when ``len(iterable)`` does not say (a generator).
        leave: keep the finished bar on the terminal; False for a bar nested in another.
    """
    if not enabled():
        return iterable
    from tqdm import tqdm

    return tqdm(
        iterable, desc=desc, total=total, leave=leave, file=sys.stderr, delay=DELAY_S,
        dynamic_ncols=True,
    )  # fmt: skip


def echo(text: str, file: TextIO | None = None) -> None:
    """Print one line of a tool's output (``print(text, file=file, flush=True)``) without
    breaking a bar that may be on the terminal.

    Args:
        text: the line, without its newline.
        file: where it goes; default stdout.
    """
    file = sys.stdout if file is None else file
    if enabled():
        from tqdm import tqdm

        tqdm.write(text, file=file)
        file.flush()
    else:
        print(text, file=file, flush=True)


class _NoProgress(argparse.Action):
    """``--no-progress``: switches the bars off as it is parsed; adds nothing to the namespace,
    so that a tool passing its arguments on as keywords need not know about it."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        set_enabled(False)


def add_no_progress_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--no-progress`` (no bars on stderr) to a tool's parser."""
    parser.add_argument(
        "--no-progress",
        action=_NoProgress,
        help="no progress bars (they are drawn on stderr only when it is a terminal)",
    )
