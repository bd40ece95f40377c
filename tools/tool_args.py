# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Argument parsing shared by the command-line tools in ``tools/``.

Every tool reports a user error the same way: its usage, then one ``error: ...`` line, and
exit status :data:`EXIT_ERROR`.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_ERROR = 2
"""Exit status for every user error, as argparse uses for bad arguments."""


class ToolParser(argparse.ArgumentParser):
    """An argument parser whose errors end in one ``error: ...`` line."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_ERROR)


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer > 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonneg_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def nonneg_float(text: str) -> float:
    """An ``argparse`` type: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value
