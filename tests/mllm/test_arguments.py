# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Megatron's parser plus OrchWeave's flags, and the one error line every bad input gets."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from datetime import timedelta

import pytest
import torch
from equivalence import VARIABLE_JSONL

from megatron.mllm import distributed, logs, training
from megatron.mllm.arguments import ConfigError, parse_arguments
from megatron.mllm.run_config import OPTION_GROUPS, EncoderArgs, RunConfig

BASE = [
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
    "--seq-length", "128", "--max-position-embeddings", "128", "--vocab-size", "500",
    "--micro-batch-size", "2", "--train-iters", "3", "--lr", "1e-3",
]  # fmt: skip


def test_megatron_flags_and_ours_parse_with_derived_defaults():
    args = parse_arguments([*BASE, "--vision-hidden-size", "48", "--audio-num-layers", "0"], 2)
    assert args.data_parallel_size == 2
    assert args.global_batch_size == 4  # Megatron's default: mbs x dp
    assert args.vision_hidden_size == 48 and args.vision_ffn_hidden_size == 192
    assert args.vision_num_attention_heads == 4
    assert args.audio_num_layers == 0
    assert args.padded_vocab_size == 512  # Megatron pads to a multiple of 128 x TP
    assert args.workload == "omni-three-modality" and args.workload_seed == args.seed


def test_the_typed_run_config_carries_every_flag(capfd):
    args = parse_arguments(
        [*BASE, "--post-balance", "kk", "--post-balance-token-caps", "vision=100", "llm=900",
         "--no-check-plan-digest", "--balance-phases", "vision", "llm", "--pipeline-schedule",
         "dynamic", "--pipeline-model-parallel-size", "2", "--vision-chunks-per-stage", "2",
         "--audio-num-layers", "0", "--vision-num-layers", "4", "--projector-type", "affine",
         "--lr-warmup-iters", "1"],
        4,
    )  # fmt: skip
    run = RunConfig.from_args(args)
    assert run.parallel.data == 2 and run.num_microbatches == 1 and run.packing_limit == 256
    assert run.balance.post_balance == "kk" and not run.balance.check_plan_digest
    assert run.balance.token_caps == {"vision": 100, "llm": 900}
    assert run.balance.balance_phases == ["vision", "llm"]
    assert run.pipeline.chunks_per_stage() == {"vision": 2, "audio": 1, "llm": 1}
    assert run.uses_runtime and run.multimodal.projector_type == "affine"
    assert set(run.encoders) == {"vision"} and run.encoders["vision"].num_layers == 4
    assert run.training.train_iters == 3 and run.optimizer.lr == 1e-3
    assert run.ddp.use_distributed_optimizer is False
    # Every field of OrchWeave's config dataclasses is a flag whose help is its docstring.
    with pytest.raises(SystemExit) as done:
        parse_arguments(["--help"])
    assert done.value.code == 0
    help_text = capfd.readouterr().out  # printed to sys.__stdout__, past capsys
    for _, cls in OPTION_GROUPS:
        for f in dataclasses.fields(cls):
            names = f.metadata.get("argparse_meta", {}).get("arg_names")
            assert (names or ["--" + f.name.replace("_", "-")])[0] in help_text, f.name
    for f in dataclasses.fields(EncoderArgs):
        assert f"--audio-{f.name.replace('_', '-')}" in help_text, f.name
    assert "Hidden classes of synthetic images/audio" in help_text


def test_the_distributed_optimizer_shards_in_ddp_and_in_the_optimizer_alike():
    run = RunConfig.from_args(parse_arguments([*BASE, "--use-distributed-optimizer"], 2))
    assert run.ddp.use_distributed_optimizer and run.optimizer.use_distributed_optimizer
    assert not run.ddp.overlap_grad_reduce and not run.ddp.overlap_param_gather
    assert run.ddp.bucket_size is None  # one bucket, reduced after the backward


def test_overlapped_reduction_takes_megatrons_bucket_size():
    flags = [*BASE, "--overlap-grad-reduce", "--ddp-bucket-size", "12345"]
    run = RunConfig.from_args(parse_arguments(flags, 2))
    assert run.ddp.overlap_grad_reduce and run.ddp.bucket_size == 12345
    # Without --ddp-bucket-size megatron-core's DDP picks its default when it is built.
    run = RunConfig.from_args(parse_arguments([*BASE, "--overlap-grad-reduce"], 2))
    assert run.ddp.overlap_grad_reduce and run.ddp.bucket_size is None


HUGE = 10**20
"""A token count no int64 holds."""

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only refusal")

BAD_INPUT = [
    # (flags, world size, what the one error line must name)
    (["--pipeline-model-parallel-size", "2"], 3,
     r"--pipeline-model-parallel-size 2 .* does not divide the world size 3"),
    (["--tensor-model-parallel-size", "4"], 2, r"--tensor-model-parallel-size 4 .*world size 2"),
    (["--pipeline-model-parallel-size", "3"], 3,
     r"--num-layers 4 is not divisible by --pipeline-model-parallel-size 3"),
    (["--global-batch-size", "6"], 2,
     r"--global-batch-size 6 is not a multiple of --micro-batch-size 2 x data-parallel size 2"),
    (["--vision-num-attention-heads", "5"], 1,
     r"--vision-hidden-size 64 is not divisible by --vision-num-attention-heads 5"),
    (["--num-attention-heads", "7"], 1,
     r"--hidden-size 64 is not divisible by --num-attention-heads 7"),
    (["--workload-token-scale", "0"], 1, r"--workload-token-scale must be positive"),
    (["--lr-warmup-iters", "3"], 2,
     r"--lr-warmup-iters 3 must be smaller than the decay iterations \(--train-iters 3\)"),
    (["--lr-warmup-fraction", "1.0"], 1, r"--lr-warmup-fraction 1.0 must be >= 0 and below 1"),
    (["--train-iters", "0"], 1, r"--train-iters 0 must be positive"),
    (["--lr-warmup-init", "0.1"], 1, r"--lr-warmup-init 0.1 must be <= --lr 0.001"),
    (["--start-weight-decay", "0.1", "--end-weight-decay", "0.01", "--weight-decay-incr-style",
      "linear"], 1, r"--end-weight-decay 0.01 must be >= --start-weight-decay 0.1"),
    (["--max-position-embeddings", "64"], 2,
     r"Megatron's argument validation failed: "
     r"max_position_embeddings \(64\) must be greater than or equal to seq_length"),
    (["--fp16", "--bf16"], 2,
     r"Megatron's argument validation failed: assert not args\.bf16 \(arguments\.py:\d+\)"),
    (["--post-balance", "auto", "--node-wise-a2a", "--gpus-per-node", "3"], 2,
     r"--gpus-per-node 3 does not divide the world size 2"),
    (["--post-balance", "auto", "--post-balance-token-caps", "video=10"], 2,
     r"--post-balance-token-caps: expected PHASE=TOKENS"),
    (["--post-balance", "auto", "--post-balance-token-caps", "llm=10", "llm=20"], 2,
     r"--post-balance-token-caps: llm is capped twice"),
    (["--post-balance-token-caps", "llm=10"], 2,
     r"--post-balance-token-caps caps what balancing gives a rank: it needs --post-balance"),
    (["--step-prediction"], 2, r"--step-prediction .* needs --timing-log-level 1 or 2"),
    # The partitioner's flags.
    (["--pipeline-model-parallel-size", "2", "--vision-chunks-per-stage", "auto"], 2,
     r"--vision-chunks-per-stage auto needs --pipeline-schedule dynamic .*, got "
     r"--pipeline-schedule megatron"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b",
      "--encoder-sub-microbatch-size", "auto"], 2,
     r"--encoder-sub-microbatch-size auto needs --pipeline-schedule dynamic"),
    (["--encoder-sub-microbatch-size", "4", "--encoder-sub-microbatch-tokens", "64"], 2,
     r"--encoder-sub-microbatch-size and --encoder-sub-microbatch-tokens both cut"),
    (["--llm-chunks-per-stage", "0"], 2, r"--llm-chunks-per-stage must be >= 1 or auto"),
    (["--encoder-sub-microbatch-size", "-1"], 2,
     r"--encoder-sub-microbatch-size must be >= 0 or auto"),
    (["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic",
      "--vision-num-layers", "1", "--vision-chunks-per-stage", "auto"], 2,
     r"cuts the vision module into --pipeline-model-parallel-size 2 x "
     r"--vision-chunks-per-stage auto \(at least 1\) chunks, but it has only 1 layers"),
    # Sharded data parallelism: what OrchWeave's steps cannot run, before Megatron's checks.
    (["--ddp-bucket-size", "1000"], 2,
     r"--ddp-bucket-size sizes the buckets of --overlap-grad-reduce: add it"),
    # --overlap-param-gather runs as in Megatron: with both of these (Megatron's own checks).
    (["--use-distributed-optimizer", "--overlap-param-gather"], 2,
     r"Megatron's argument validation failed: Must use --overlap-param-gather with "
     r"--overlap-grad-reduce"),
    (["--overlap-grad-reduce", "--overlap-param-gather"], 2,
     r"--overlap-param-gather only supported with distributed optimizer"),
    (["--use-megatron-fsdp"], 2,
     r"--use-megatron-fsdp is not supported by OrchWeave: megatron-core 0\.19\.2's "
     r"Megatron-FSDP builds its device mesh without pipeline stages"),
    # Half precision on a CPU (with CUDA these flags train: tools/gpu/check.sh runs them).
    *(pytest.param([flag], 2, rf"{flag} needs a CUDA device: megatron-core's mixed-precision",
                   marks=CPU_ONLY) for flag in ("--bf16", "--fp16")),
    (["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"], 2,
     r"--num-layers-per-virtual-pipeline-stage \(megatron-core's virtual pipeline stages\) is "
     r"not supported by OrchWeave's trainer: --pipeline-schedule interleaved"),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"], 2,
     r"--num-virtual-stages-per-pipeline-rank \(megatron-core's"),
    (["--num-experts", "2"], 2, r"--num-experts 2 is not supported by OrchWeave yet"),
    (["--decoupled-lr", "1e-3"], 2, r"--decoupled-lr is not supported by OrchWeave"),
    (["--num-distributed-optimizer-instances", "2"], 2,
     r"--num-distributed-optimizer-instances 2 copies the distributed optimizer's shards: add "
     r"--use-distributed-optimizer"),
    (["--use-distributed-optimizer", "--num-distributed-optimizer-instances", "3"], 2,
     r"--num-distributed-optimizer-instances 3 must divide the data-parallel size 2"),
    (["--rampup-batch-size", "8", "8", "16"], 2,
     r"--rampup-batch-size is not supported by OrchWeave: .* one global batch size"),
    (["--profile-trace", "t.json"], 2, r"--profile-trace needs --profile"),
    (["--cost-calibration", "nowhere.json"], 2,
     r"--cost-calibration nowhere.json: calibration file not found"),
    (["--profile", "--train-iters", "5"], 2, r"--profile-step-end 12 is past --train-iters 5"),
    (["--profile", "--profile-step-start", "3", "--profile-step-end", "3"], 2,
     r"--profile-step-start 3 must be >= 0 and below --profile-step-end 3"),
    (["--profile", "--profile-step-start", "0", "--profile-step-end", "1", "--profile-ranks",
      "2"], 2, r"--profile-ranks 2 is not a rank of this 2-rank run"),
    # Tensor parallelism: the flag at fault, not megatron-core's field.
    (["--tensor-model-parallel-size", "2", "--num-attention-heads", "1",
      "--vision-num-attention-heads", "4", "--audio-num-attention-heads", "4"], 2,
     r"--num-attention-heads 1 is not divisible by --tensor-model-parallel-size 2"),
    (["--tensor-model-parallel-size", "2", "--vision-num-attention-heads", "1"], 2,
     r"--vision-num-attention-heads 1 is not divisible by --tensor-model-parallel-size 2"),
    (["--tensor-model-parallel-size", "2", "--audio-num-attention-heads", "1"], 2,
     r"--audio-num-attention-heads 1 is not divisible by --tensor-model-parallel-size 2"),
    (["--tensor-model-parallel-size", "2", "--ffn-hidden-size", "33"], 2,
     r"--ffn-hidden-size 33 is not divisible by --tensor-model-parallel-size 2"),
    (["--tensor-model-parallel-size", "2", "--vision-ffn-hidden-size", "33"], 2,
     r"--vision-ffn-hidden-size 33 is not divisible by --tensor-model-parallel-size 2"),
    (["--tensor-model-parallel-size", "2", "--group-query-attention", "--num-query-groups", "3",
      "--num-attention-heads", "6", "--hidden-size", "60", "--vision-num-attention-heads", "4",
      "--audio-num-attention-heads", "4", "--vision-hidden-size", "64",
      "--audio-hidden-size", "64"], 2,
     r"--num-query-groups 3 must be a multiple or a divisor of --tensor-model-parallel-size 2"),
    # The workload against the model, read before any process group starts.
    (["--vision-num-layers", "0"], 2,
     r"sample 'omni-three-modality-1234-\d+' \(stream index \d+\) has image items but the "
     r"model has no vision encoder \(--vision-num-layers is 0\)"),
    (["--audio-num-layers", "0", "--workload", "{variable}", "--workload-token-scale", "1"], 2,
     r"sample 'img-e' \(stream index 4\) has audio items but the model has no audio encoder "
     r"\(--audio-num-layers is 0\)"),
    (["--workload", "{huge_text}", "--workload-token-scale", "1"], 2,
     r"huge_text.jsonl:2 \(sample 'big'\): 'text_tokens' must be an int in \[0, 2147483647\]"),
    (["--workload", "{huge_unit}", "--workload-token-scale", "1"], 2,
     r"huge_unit.jsonl:2 \(sample 'big'\)\.image\[0\]\.units: 100000000000000000000 is more "
     r"than 2147483647 tokens"),
    (["--workload-token-scale", "1e300"], 2,
     r"omni-three-modality: max_sequence_tokens: 8192 tokens x token scale 1e\+300 is more than"),
    (["--workload", "{missing}"], 2, r"workload file not found: .*missing.jsonl"),
    (["--cost-fit-warmup", "9", "--cost-fit-window", "8"], 2,
     r"--cost-fit-warmup 9 must not exceed --cost-fit-window 8"),
    (["--cost-fit-window", "0"], 2, r"--cost-fit-window must be >= 1, got 0"),
    (["--schedule-search-workers", "9999"], 2,
     r"--schedule-search-workers must be between 1 and \d+ \(half of this host's \d+ cores\), "
     r"got 9999"),
    (["--schedule-search-guard-interval", "10"], 2,
     r"--schedule-search-guard-interval must be 0 \(no guard\) or at least one probe of 24 "
     r"iterations, got 10"),
    (["--schedule-search-guard-interval", "-1"], 2,
     r"--schedule-search-guard-interval must be >= 0, got -1"),
    (["--post-balance-alternate", "-1"], 2,
     r"--post-balance-alternate must be >= 0 \(0: off\), got -1"),
    (["--post-balance-alternate", "5"], 2,
     r"--post-balance-alternate 5 alternates balancing with Megatron's step: it needs "
     r"--post-balance lpt, kk or auto \(got --post-balance none\)"),
    (["--schedule-search-alternate", "-1"], 2,
     r"--schedule-search-alternate must be >= 0 \(0: off\), got -1"),
    (["--schedule-search-alternate", "5", "--pipeline-model-parallel-size", "2",
      "--pipeline-schedule", "dynamic"], 2,
     r"--schedule-search-alternate 5 alternates the searched schedule with greedy's: it needs "
     r"--pipeline-schedule dynamic and --schedule-search-budget-ms > 0 \(got --pipeline-schedule "
     r"dynamic, --schedule-search-budget-ms None\)"),
    (["--schedule-search-alternate", "5", "--schedule-search-budget-ms", "50"], 2,
     r"--schedule-search-alternate 5 .*\(got --pipeline-schedule megatron, "),
    ([None, "--lr"], 2, r"--lr is required to train"),  # None: BASE without this flag
]  # fmt: skip


@pytest.fixture(scope="module")
def workload_files(tmp_path_factory):
    """Workload files of the bad-input cases, by placeholder."""
    root = tmp_path_factory.mktemp("workloads")
    fine = json.dumps({"id": "fine", "text_tokens": 5})
    files = {
        "huge_text": f'{fine}\n{{"id": "big", "text_tokens": {HUGE}}}\n',
        "huge_unit": f'{fine}\n{{"id": "big", "text_tokens": 5, "image": '
        f'[{{"units": [{HUGE}], "llm_tokens": 4}}]}}\n',
        "variable": VARIABLE_JSONL,
    }
    out = {"missing": str(root / "missing.jsonl")}
    for name, text in files.items():
        (root / f"{name}.jsonl").write_text(text)
        out[name] = str(root / f"{name}.jsonl")
    return out


@pytest.mark.parametrize("flags,world,culprit", BAD_INPUT)
def test_bad_input_stops_the_trainer_with_one_error_line_naming_it(
    flags, world, culprit, workload_files, monkeypatch, capsys
):
    # In process, as every rank runs it: each of these is found before any process group
    # starts, the same way on every rank (one case runs on 2 ranks in test_training.py).
    def no_process_groups(run):
        raise AssertionError("the check ran after distributed init")

    monkeypatch.setattr(distributed, "initialize_distributed", no_process_groups)
    monkeypatch.setattr(logs, "configure", lambda level: None)
    monkeypatch.setenv("WORLD_SIZE", str(world))
    base = BASE
    if flags and flags[0] is None:  # a flag BASE gives, left out (with its value)
        at = BASE.index(flags[1])
        base, flags = BASE[:at] + BASE[at + 2 :], flags[2:]
    argv = [*base, *(f.format(**workload_files) for f in flags)]
    assert training.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, errors
    assert re.search(culprit, errors[0]), errors[0]


def test_node_wise_exchange_counts_data_parallel_ranks_per_node_as_the_dispatcher():
    # TP=8 on 8-GPU nodes: one DP rank per node, which the Dispatcher routes node-wise (the
    # DP size 4 is not a multiple of the 8 GPUs of a node, and need not be).
    flags = [*BASE, "--post-balance", "auto", "--node-wise-a2a", "--gpus-per-node", "8"]
    args = parse_arguments([*flags, "--tensor-model-parallel-size", "8"], 32)
    assert args.data_parallel_size == 4 and args.node_wise_a2a
    assert parse_arguments([*flags, "--tensor-model-parallel-size", "2"], 16).node_wise_a2a
    # TP=3 on 8-GPU nodes: DP ranks 0, 3, 6 | 9 | 12, 15 fill the nodes unevenly.
    with pytest.raises(ConfigError, match=r"do not fill nodes of --gpus-per-node 8"):
        parse_arguments([*flags, "--tensor-model-parallel-size", "3"], 24)


def test_the_distributed_timeout_takes_fractions_of_a_minute_and_must_be_positive():
    # Megatron's flag is whole minutes; fractions let tests and short jobs fail within seconds.
    run = RunConfig.from_args(parse_arguments([*BASE, "--distributed-timeout-minutes", "0.15"], 1))
    assert run.distributed_timeout == timedelta(seconds=9)
    default = RunConfig.from_args(parse_arguments(BASE, 1)).distributed_timeout
    assert default == timedelta(minutes=10)  # Megatron's
    for bad in ("0", "-0.5", "nan"):
        with pytest.raises(
            ConfigError, match=r"--distributed-timeout-minutes must be a number > 0"
        ):
            parse_arguments([*BASE, "--distributed-timeout-minutes", bad], 1)


DYNAMIC = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "dynamic"]


def test_partitioner_flags_take_an_int_or_auto(capsys):
    run = RunConfig.from_args(parse_arguments([*BASE, *DYNAMIC, "--vision-chunks-per-stage", "auto",
                                               "--encoder-sub-microbatch-size", "3"], 2))  # fmt: skip
    assert run.pipeline.chunks_per_stage() == {"vision": "auto", "audio": 1, "llm": 1}
    assert run.pipeline.encoder_sub_microbatch_size == 3
    assert run.pipeline.auto_flags == ["--vision-chunks-per-stage"]
    with pytest.raises(SystemExit):
        parse_arguments([*BASE, "--audio-chunks-per-stage", "many"], 2)
    assert "expected an integer or 'auto', got 'many'" in capsys.readouterr().err


def test_auto_flags_give_every_rank_the_partitioners_placement_and_subs():
    from megatron.mllm.config import mllm_config
    from megatron.mllm.partitioning import partition_plan, sub_microbatch_units
    from megatron.mllm.pipeline import runtime_placement
    from pipeweaver.placement import Placement

    flags = [*BASE, *DYNAMIC, "--num-layers", "6", "--vision-num-layers", "4",
             "--llm-chunks-per-stage", "auto", "--encoder-sub-microbatch-size", "auto"]  # fmt: skip
    run = RunConfig.from_args(parse_arguments(flags, 2))
    mllm = mllm_config(run)
    plan = partition_plan(run, mllm)
    assert plan == partition_plan(run, mllm)  # deterministic: every rank plans the same
    assert "chunks:llm" in plan.auto and "chunks:vision" not in plan.auto
    assert plan.chunks_per_stage["vision"] == 1 and set(plan.sub_microbatch_units) == {
        "vision", "audio"
    }  # fmt: skip
    placement = runtime_placement("dynamic", 2, mllm, run.pipeline.chunks_per_stage(), plan)
    assert placement == Placement.from_splits(2, plan.splits)
    assert plan.split_by_cost and placement.num_layers("llm") == 6
    assert placement.num_chunks("vision") == 2 and placement.num_layers("vision") == 4
    assert sub_microbatch_units(run, plan) == dict(plan.sub_microbatch_units)
    fixed = RunConfig.from_args(parse_arguments([*BASE, *DYNAMIC, "--encoder-sub-microbatch-size",
                                                 "2"], 2))  # fmt: skip
    assert partition_plan(fixed, mllm_config(fixed)) is None
    assert sub_microbatch_units(fixed, None) == {"vision": 2, "audio": 2}
