# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What the command-line tools share: argument parsing (megatron.mllm.cli.args), one error line
for every bad input, and progress bars (megatron.mllm.cli.progress)."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys

import pytest
from tqdm import tqdm

from megatron.mllm import logs
from megatron.mllm.cli import (
    balance_report,
    calibrate,
    explain_step,
    plot_loss,
    progress,
    semu,
    workload,
)
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


HUGE = 10**20
"""A token count no int64 holds."""

TOOLS = {
    "workload": workload.main,
    "balance_report": balance_report.main,
    "semu": semu.main,
    "calibrate": calibrate.main,
    "explain_step": explain_step.main,
    "plot_loss": plot_loss.main,
}
SEMU = ["--model", "cpu-main", "--cluster", "cpu-2ranks"]
PP2 = [*SEMU, "--set", "pipeline-model-parallel-size=2", "--schedule", "dataflow"]
CALIBRATE = ["--quick", "--output", "{dir}/c.json"]

BAD_INPUT = [
    # (tool, arguments, what the one error line must name)
    ("workload", ["{huge_text}"],
     r"huge_text.jsonl:2 \(sample 'big'\): 'text_tokens' must be an int in \[0, 2147483647\], "
     r"got 100000000000000000000"),
    ("workload", ["{huge_item}"],
     r"huge_item.jsonl:2 \(sample 'big'\)\.audio\[0\]: 100000000000000000000 is more than "
     r"2147483647 tokens"),
    ("workload", ["{negative}"], r"negative.jsonl:2 \(sample 'neg'\)\.image\[0\]: expected a "
     r"positive int, got -4"),
    ("workload", ["{not_object}"], r"not_object.jsonl:1: a sample must be a JSON object, got list"),
    ("workload", ["{bad}"], r"bad.json: malformed JSON"),
    ("workload", ["{sigma}", "--num-samples", "5"],
     r"sigma.json: sample 'x-0-\d' \(component 'c'\)\.text_tokens: inf tokens"),
    ("workload", ["{many_items}", "--num-samples", "1"],
     r"many_items.json: sample 'x-0-0' \(component 'c'\)\.image\.count: 1e\+12 items, more "
     r"than the 100 LLM positions"),
    ("workload", ["omni-three-modality", "--num-samples", str(HUGE)],
     r"argument --num-samples: expected a positive integer and at most 1,000,000"),
    ("workload", ["omni-three-modality", "--token-scale", "1e300"],
     r"omni-three-modality: max_sequence_tokens: 8192 tokens x token scale 1e\+300"),
    ("balance_report", ["{huge_text}", "--dp", "2", "--samples-per-rank", "1"],
     r"huge_text.jsonl:2 \(sample 'big'\): 'text_tokens'"),
    ("balance_report", ["omni-three-modality", "--dp", "2", "--token-scale", "inf"],
     r"argument --token-scale: expected a positive number, got 'inf'"),
    ("balance_report", ["omni-three-modality", "--dp", str(HUGE)], r"argument --dp"),
    ("balance_report", ["omni-three-modality", "--dp", "100000", "--samples-per-rank", "100"],
     r"--dp 100000 x --samples-per-rank 100 is more than 1,000,000 samples"),
    ("balance_report", ["omni-three-modality", "--dp", "2", "--vision-num-layers", "0"],
     r"sample 'omni-three-modality-0-\d+' \(DP rank \d, position \d, stream index \d+\) has "
     r"image items but the model has no vision encoder \(--vision-num-layers is 0\)"),
    ("balance_report", ["omni-three-modality", "--dp", "2", "--num-attention-heads", "7"],
     r"--hidden-size 64 is not divisible by --num-attention-heads 7"),
    ("semu", ["--model", "cpu-main", "--cluster", "{bad}"], r"bad.json: malformed JSON"),
    ("semu", [*SEMU, "--workload", "{huge_text}", "--token-scale", "1"],
     r"huge_text.jsonl:2 \(sample 'big'\)"),
    ("semu", [*SEMU, "--set", "vision-num-layers=0"],
     r"sample 'omni-three-modality-1234-\d+' \(stream index \d+\) has image items but the "
     r"model has no vision encoder \(--vision-num-layers is 0\)"),
    ("semu", [*SEMU, "--token-scale", "inf"], r"argument --token-scale"),
    ("semu", [*SEMU, "--token-scale", "1e300"], r"max_sequence_tokens"),
    ("semu", [*SEMU, "--replicas", "0"], r"argument --replicas: expected a positive integer"),
    ("semu", [*SEMU, "--iteration", "-1"], r"argument --iteration: expected an integer >= 0"),
    ("semu", [*SEMU, "--encoder-sub-microbatch-tokens", "-5"],
     r"argument --encoder-sub-microbatch-tokens"),
    ("semu", [*PP2, "--placement", "interleaved", "--chunks-per-rank", "video=2"],
     r"--chunks-per-rank: unknown module 'video'"),
    ("semu", [*PP2, "--placement", "interleaved", "--chunks-per-rank", "vision=x"],
     r"--chunks-per-rank: vision=x is not a positive integer"),
    ("semu", [*SEMU, "--balancer-bytes", "{list}"], r"list.json: expected a JSON object"),
    ("semu", [*SEMU, "--balancer-bytes", "{bad_bytes}"],
     r"bad_bytes.json: 'vision' must be bytes per device"),
    ("semu", [*SEMU, "--trace", "{dir}/no/such/dir/t.json"], r"cannot write .*t.json"),
    ("semu", [*SEMU, "--set", "num-layer=3"],
     r"--set num-layer: the trainer has no flag --num-layer; did you mean --num-layers"),
    ("semu", [*SEMU, "--set", "text_tokens=1e20"], r"--set text_tokens: the trainer has no flag"),
    ("semu", [*SEMU, "--set", "seq-length=64", "--set", "max-position-embeddings=64"],
     r"sample 'omni-three-modality-1234-\d+' \(stream index \d+, loaded by data-parallel rank "
     r"\d\) has \d+ LLM tokens \(\d+ text \+ \d+ from encoders\), more than --seq-length 64"),
    ("semu", [*SEMU, "--set", "seq-length=64", "--set", "max-position-embeddings=64", "--set",
              "overlong-samples=drop"], r"--overlong-samples drop: .* only under"),
    ("semu", [*PP2[:6], "--schedule", "dynamic", "--chunks-per-rank", "vision=2"],
     r"--pipeline-schedule dynamic cuts the vision module into --pipeline-model-parallel-size 2 "
     r"x --vision-chunks-per-stage 2 chunks, but it has only 2 layers"),
    ("semu", [*PP2[:6], "--schedule", "1f1b", "--set", "num-layers=3", "--set",
              "pipeline-schedule=dynamic"],
     r"--schedule 1f1b and --set pipeline-schedule=dynamic disagree"),
    ("calibrate", ["--reps", "-1", *CALIBRATE], r"argument --reps: expected a positive integer"),
    ("calibrate", ["--threads", "0", *CALIBRATE], r"argument --threads"),
    ("calibrate", ["--max-tokens", "4", *CALIBRATE],
     r"--max-tokens 4 leaves no grid point: the smallest is --lengths 8 x --packs 1 = 8"),
    ("calibrate", ["--lengths", "x", *CALIBRATE], r"argument --lengths"),
    ("calibrate", ["--stages", "nope", *CALIBRATE], r"unknown stages \['nope'\]"),
    ("calibrate", ["--stages", "layers,trainer", *CALIBRATE],
     r"the trainer stage needs the layers, optimizer and host stages"),
    ("calibrate", ["--base", "{dir}/missing.json", *CALIBRATE],
     r"--base calibration file not found: .*missing.json"),
    ("explain_step", ["{huge_text}", "--skip", "-1"], r"argument --skip"),
    ("explain_step", ["{huge_text}", "--top", "x"], r"argument --top"),
    ("explain_step", ["{dir}/missing.jsonl"], r"cannot read .*missing.jsonl"),
    ("plot_loss", ["{dir}/missing.jsonl", "--out", "{dir}/x.png"], r"missing.jsonl: no such file"),
    ("plot_loss", ["{bad}", "--out", "{dir}/x.png"], r"bad.json:1: not a JSON record"),
    ("plot_loss", ["{huge_text}", "--out", "{dir}/x.png"], r"huge_text.jsonl: no record with"),
]  # fmt: skip


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """The files of the bad-input cases, by placeholder."""
    root = tmp_path_factory.mktemp("bad-input")
    fine = json.dumps({"id": "fine", "text_tokens": 5})

    def spec(text, **modalities):
        return {"name": "x", "max_sequence_tokens": 100, "components": [
            {"name": "c", "weight": 1, "text_tokens": text, **modalities}]}  # fmt: skip

    image = {"encoder_tokens": {"dist": "const", "value": 4}, "llm_tokens_per_encoder_token": 1}
    files = {
        "huge_text.jsonl": f'{fine}\n{{"id": "big", "text_tokens": {HUGE}}}\n',
        "huge_item.jsonl": f'{fine}\n{{"id": "big", "text_tokens": 5, "audio": [{HUGE}]}}\n',
        "negative.jsonl": f'{fine}\n{{"id": "neg", "text_tokens": 5, "image": [-4]}}\n',
        "not_object.jsonl": "[1, 2]\n",
        "bad.json": "{not json",
        "list.json": "[1, 2]",
        "bad_bytes.json": json.dumps({"vision": "lots"}),
        "sigma.json": json.dumps(spec({"dist": "lognormal", "median": 10, "sigma": 1e6})),
        "many_items.json": json.dumps(spec(
            {"dist": "const", "value": 5},
            image={"count": {"dist": "const", "value": 1e12}, **image})),  # fmt: skip
    }
    out = {"dir": str(root)}
    for name, text in files.items():
        (root / name).write_text(text)
        out[name.split(".")[0]] = str(root / name)
    return out


@pytest.mark.parametrize("tool,argv,culprit", BAD_INPUT)
def test_bad_input_is_one_error_line_naming_it(tool, argv, culprit, bad_files, monkeypatch, capsys):
    # In process (each tool's main is its console script): exit status 2, no traceback.
    monkeypatch.setattr(logs, "configure", lambda level: None)
    try:
        status = TOOLS[tool]([a.format(**bad_files) for a in argv])
    except SystemExit as e:  # argparse's errors
        status = e.code
    assert status == EXIT_ERROR
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert re.search(culprit, errors[0]), errors[0]


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


def test_plot_loss_draws_every_run_and_keeps_a_resumes_last_record(tmp_path, capsys):
    from PIL import Image

    first = tmp_path / "first.jsonl"
    rows = [{"iteration": i, "lm_loss": 6.0 - i} for i in (1, 2, 3)] + [{"iteration": 2}]
    # A resume from iteration 1 rewrites iteration 2 and 3: the later records win.
    rows += [{"iteration": 2, "lm_loss": 4.5}, {"iteration": 3, "lm_loss": 3.5}]
    first.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert plot_loss.read_losses(str(first)) == ([1, 2, 3], [5.0, 4.5, 3.5])
    second = tmp_path / "second.jsonl"
    second.write_text(json.dumps({"iteration": 7, "lm_loss": 1.25}) + "\n")
    out = tmp_path / "loss.png"
    assert plot_loss.main([str(first), f"other={second}", "--out", str(out)]) == 0
    assert "2 run(s); loss 5.0000 at iteration 1, 1.2500 at 7" in capsys.readouterr().out
    with Image.open(out) as png:
        assert png.format == "PNG" and png.size[0] > 300


def test_free_ports_lie_below_the_kernels_ephemeral_range_and_bind():
    """A rendezvous port the kernel could hand another process's outgoing connection was
    taken before the run bound it (EADDRINUSE with several runs started at once)."""
    import socket

    from megatron.mllm.cli.launch import _ephemeral_start, free_port

    ports = {free_port() for _ in range(20)}
    assert all(1024 <= p < _ephemeral_start() for p in ports)
    assert len(ports) > 1  # drawn, not one fixed port for every caller
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))
