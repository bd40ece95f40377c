# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the command-line tools share: argument parsing (megatron.mllm.cli.args) and progress
bars (megatron.mllm.cli.progress)."""

from __future__ import annotations

import argparse
import io
import sys

import pytest
from tqdm import tqdm

from megatron.mllm.cli import progress
from megatron.mllm.cli.args import EXIT_ERROR, ToolParser, number


@pytest.mark.parametrize(
    "kind,zero,good,bad,expected",
    [
        (int, False, {"1": 1, "12": 12}, ["0", "-3", "1.5", "x"], "a positive integer"),
        (int, True, {"0": 0, "7": 7}, ["-1", "x"], "an integer >= 0"),
        (float, False, {"0.5": 0.5, "3": 3.0}, ["0", "-1", "inf", "nan", "x"], "a positive number"),
        (float, True, {"0": 0.0, "2.5": 2.5}, ["-0.1", "inf", "nan"], "a number >= 0"),
    ],
)
def test_number_types(kind, zero, good, bad, expected):
    parse = number(kind, zero=zero)
    for text, value in good.items():
        got = parse(text)
        assert got == value and type(got) is kind
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected {expected}, got '{text}'"):
            parse(text)


def test_tool_parser_error_is_one_line(capsys):
    parser = ToolParser(prog="tool")
    parser.add_argument("--n", type=number(int), required=True)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--n", "0"])
    assert exit_.value.code == EXIT_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("usage: tool")
    assert err[-1] == "error: argument --n: expected a positive integer, got '0'"


class _Stderr(io.StringIO):
    """A captured stderr that claims to be (or not to be) a terminal."""

    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_is_the_plain_iterable_unless_stderr_is_a_terminal(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    items = [1, 2, 3]
    monkeypatch.setattr(sys, "stderr", _Stderr(tty=False))
    assert progress.progress(items, "x") is items
    monkeypatch.setattr(sys, "stderr", _Stderr(tty=True))
    bar = progress.progress(items, "x", leave=False)
    assert isinstance(bar, tqdm) and list(bar) == items
    # Off by the environment (the suite's setting) and by --no-progress, on a terminal too.
    monkeypatch.setenv(progress.ENV, "0")
    assert progress.progress(items, "x") is items
    monkeypatch.delenv(progress.ENV)
    parser = argparse.ArgumentParser()
    progress.add_no_progress_flag(parser)
    monkeypatch.setattr(progress, "_enabled", True)
    assert vars(parser.parse_args(["--no-progress"])) == {}
    assert progress.progress(items, "x") is items


def test_progress_echo_writes_the_same_bytes_with_a_bar(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    outputs = []
    for tty in (False, True):
        monkeypatch.setattr(sys, "stderr", _Stderr(tty))
        out = io.StringIO()
        for i in progress.progress(range(3), "x", leave=False):
            progress.echo(f"line {i}", file=out)
        outputs.append(out.getvalue())
    assert outputs[0] == outputs[1] == "line 0\nline 1\nline 2\n"
