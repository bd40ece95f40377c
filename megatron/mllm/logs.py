# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A quiet log: the setup summary and the iteration lines, and everything else at debug level.

megatron-core lists every parameter of every gradient bucket and its optimizer config at INFO,
and its imports warn (through ``warnings``) that Transformer Engine or Apex is absent, once per
module and process. On a two-rank CPU run that is a thousand lines around the few a user looks
for. :func:`configure` keeps them at debug level: ``--log-level debug`` (or Megatron's
``--logging-level 10``) shows them again.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import warnings
from typing import Iterator, Sequence

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}  # fmt: skip
"""``--log-level`` names."""

CHATTY_LOGGERS = {"megatron.core": logging.WARNING, "megatron.training": logging.WARNING,
                  "torch.utils.cpp_extension": logging.ERROR}  # fmt: skip
"""Loggers that list parameters and setup notes, and the least level they show unless the log
is at debug level (torch warns on every CPU machine that it found no CUDA runtime)."""

_warnings_logger = logging.getLogger("megatron.mllm.warnings")


def level_from_argv(argv: Sequence[str]) -> int:
    """The log level the command line asks for: ``--log-level``, else Megatron's
    ``--logging-level``, else INFO. Read before parsing, so that parsing is logged at it."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--log-level", choices=sorted(LEVELS))
    parser.add_argument("--logging-level", type=int)
    known, _ = parser.parse_known_args(list(argv))
    if known.log_level:
        return LEVELS[known.log_level]
    if known.logging_level is not None:
        return known.logging_level
    return logging.INFO


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    _warnings_logger.debug("%s:%s: %s: %s", filename, lineno, category.__name__, message)


def configure(level: int) -> None:
    """Log at ``level``; megatron-core's INFO chatter and Python warnings only at DEBUG."""
    logging.basicConfig(level=level, format="%(message)s", force=True)
    for name, least in CHATTY_LOGGERS.items():
        logging.getLogger(name).setLevel(level if level <= logging.DEBUG else max(level, least))
    warnings.showwarning = _log_warning


@contextlib.contextmanager
def demoted(name: str) -> Iterator[None]:
    """Within the block, logger ``name`` speaks only at debug level (for notes that libraries
    log as warnings)."""
    target = logging.getLogger(name)
    saved = target.level
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        target.setLevel(logging.ERROR)
    try:
        yield
    finally:
        target.setLevel(saved)
