# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Argument parsing shared by the command-line tools.

Every tool reports a user error the same way: one ``error: ...`` line on stderr (after the
usage, for a bad argument) and exit status :data:`EXIT_ERROR`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, NoReturn

from megatron.mllm import logs
from megatron.mllm.cli.launch import REPO

EXIT_ERROR = 2
"""Exit status for every user error, as argparse uses for bad arguments."""

MAX_GENERATED_SAMPLES = 1_000_000
"""The most samples a tool draws from a workload spec for one report: minutes of generating
(hundreds of microseconds each); a larger count is an error, not a run that never ends."""


def program_name() -> str:
    """The tool's name in its usage line: as the user ran it.

    ``tools/<name>.py`` from a checkout (as the README spells it, wherever the command was
    typed), else the console script's name (``orchweave-<name>``).
    """
    path = Path(sys.argv[0]).resolve()
    if path.suffix == ".py" and path.is_relative_to(REPO):
        return str(path.relative_to(REPO))
    return path.name


class ToolParser(argparse.ArgumentParser):
    """An argument parser whose errors end in one ``error: ...`` line."""

    def __init__(self, **kwargs) -> None:
        """Like ``argparse.ArgumentParser``; ``prog`` defaults to :func:`program_name`."""
        kwargs.setdefault("prog", program_name())
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``error: message``, and exit with :data:`EXIT_ERROR`."""
        self.print_usage(sys.stderr)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(EXIT_ERROR)


def quiet_config_files() -> ModuleType:
    """:mod:`megatron.mllm.config_files`, imported once the log is quiet.

    Parsing a config imports megatron-core, whose import warnings (and torch's note on CUDA)
    are not a tool's output: they go to the debug log, as in the trainer's quiet log, and
    stderr keeps the one ``error:`` line.
    """
    logs.configure(logging.WARNING)
    from megatron.mllm import config_files

    return config_files


def report_error(message: str) -> int:
    """Print ``error: message`` on stderr; returns :data:`EXIT_ERROR` for ``main`` to return."""
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


def number(
    kind: type[int] | type[float], *, zero: bool = False, most: int | float | None = None
) -> Callable[[str], int | float]:
    """An ``argparse`` type: a finite ``kind`` > 0 (``>= 0`` with ``zero``, ``<= most`` with
    ``most``).

    Args:
        kind: ``int`` or ``float``.
        zero: accept 0 too.
        most: the largest value accepted.

    Returns:
        The parser of one argument; a bad one raises ``argparse.ArgumentTypeError`` saying
        what was expected, e.g. ``expected a positive integer, got 'x'``.
    """
    noun = "integer" if kind is int else "number"
    article = "an" if kind is int else "a"
    expected = f"{article} {noun} >= 0" if zero else f"a positive {noun}"
    if most is not None:
        expected += f" and at most {most:,}"
    top = float("inf") if most is None else most

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        # Written so that NaN fails every comparison.
        if not ((value >= 0 if zero else value > 0) and value < float("inf") and value <= top):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse
