# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Argument parsing shared by the command-line tools in ``tools/``.

Every tool reports a user error the same way: its usage, then one ``error: ...`` line, and
exit status :data:`EXIT_ERROR`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

EXIT_ERROR = 2
"""Exit status for every user error, as argparse uses for bad arguments."""

CONFIG_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "configs"
)
"""Where model and cluster configs live (``scripts/configs/README.md``)."""


def find_config(name: str) -> str:
    """The path of a config given as a file path or a name in :data:`CONFIG_DIR`.

    Raises:
        FileNotFoundError: neither exists; the message names both places.
    """
    if os.path.isfile(name):
        return name
    for cand in (os.path.join(CONFIG_DIR, name), os.path.join(CONFIG_DIR, f"{name}.json")):
        if os.path.isfile(cand):
            return cand
    raise FileNotFoundError(f"config not found: {name} (not a file, nor a config in {CONFIG_DIR})")


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
