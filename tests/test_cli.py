# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The shared argument parsing of the command-line tools (megatron.mllm.cli.args)."""

from __future__ import annotations

import argparse

import pytest

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
