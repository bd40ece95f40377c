# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The distributed optimizer (``--use-distributed-optimizer``, ZeRO-1) and overlapped gradient
reduction (``--overlap-grad-reduce``) learn what DDP learns, in every step mode they run in, and
the sharded state resumes exactly.

One launch of 2 gloo ranks trains, one after the other: DDP at DP=2 (the reference); the
distributed optimizer at DP=2 unbalanced and balanced (also on a workload where rank 1 loads no
image and no audio, so its encoders get no gradient), at PP=2 with megatron-core's engine and
with the runtime's dynamic schedule; resumes from iteration 2 of three of them, one of the model
alone (``--no-load-optim``); a resume with the other optimizer, which must be refused; and
overlapped reduction in small buckets (PP = 1: Megatron's step and the balanced one, with DDP and
the distributed optimizer, also where rank 1 loads no image and no audio, so its encoder buckets
are complete only at the end while rank 0 completes them in its backward); and the same with the
parameters' all-gathers overlapped too (``--overlap-param-gather``), where rank 1's forward never
waits for its encoders' gathers, and where the balanced step and Megatron's run in turn. A second
launch of 4 processes runs both overlaps at DP=2 x PP=2 with whole-sample balancing, under
megatron-core's 1F1B (also in turn with Megatron's step) and the runtime's ``dynamic``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from equivalence import TINY, assert_trains_the_same, merge, variable_workload, without_key_biases
from launch import check, torchrun

pytestmark = pytest.mark.multiproc

OPTIM_WORKER = Path(__file__).with_name("optim_worker.py")
HEADS = int(TINY[TINY.index("--num-attention-heads") + 1])
DISTOPT = ["--use-distributed-optimizer"]
PP2 = ["--pipeline-model-parallel-size", "2"]
THREE = ["--train-iters", "3", "--lr-warmup-iters", "1"]
MODES = {
    "dp2": [],
    "dp2-balanced": ["--post-balance", "auto"],
    "pp2-megatron": PP2,
    "pp2-dynamic": [*PP2, "--pipeline-schedule", "dynamic", "--schedule-search-budget-ms", "0"],
    # Two copies of the state, each sharded over one rank: the shards all-reduced across them.
    "dp2-two-instances": ["--num-distributed-optimizer-instances", "2"],
}
"""Every mode runs with the distributed optimizer; DDP's DP=2 run is the reference of all."""
RESUMED = ("dp2", "dp2-balanced", "pp2-dynamic", "dp2-two-instances")
OVERLAP = ["--overlap-grad-reduce", "--ddp-bucket-size", "4000"]
"""Overlapped reduction in buckets small enough for the tiny model to have many."""
BALANCED = ["--post-balance", "auto"]
GATHER = [*OVERLAP, *DISTOPT, "--overlap-param-gather"]
"""The distributed optimizer with Megatron's usual overlaps: gradients and parameters."""
OVERLAPPED = {
    "overlap-ddp": OVERLAP,
    "overlap-ddp-balanced": [*OVERLAP, *BALANCED],
    "overlap-distopt-balanced": [*OVERLAP, *DISTOPT, *BALANCED],
    # megatron-core reduces synchronously across the copies, each bucket exactly once.
    "overlap-distopt-two-instances": [*OVERLAP, *DISTOPT, *MODES["dp2-two-instances"]],
    "gather-distopt": GATHER,
    "gather-distopt-balanced": [*GATHER, *BALANCED],
    # Balanced and Megatron's step in turn: both dispatch the gathers before their forward.
    "gather-distopt-alternate": [*GATHER, *BALANCED, "--post-balance-alternate", "1"],
}
"""Overlapped runs at DP=2, each also on the workload where rank 1 loads no image or audio."""
PP2_OVERLAPPED = {
    "overlap-pp2-megatron": [*OVERLAP, *MODES["pp2-megatron"]],
    "overlap-pp2-dynamic": [*OVERLAP, *MODES["pp2-dynamic"]],
    "gather-pp2-dynamic": [*GATHER, *MODES["pp2-dynamic"]],
}
"""Overlapped runs at PP=2 (DP=1, one replica: the chunks' declarations; with DP=2 in
``test_post_balance.py``)."""


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("optim")
    variable = variable_workload(out)
    configs = {"ddp": THREE, "variable-ddp": [*THREE, *variable]}
    for mode, flags in MODES.items():
        save = ["--save", str(out / "ckpt" / mode), "--save-interval", "2"]
        configs[f"distopt-{mode}"] = [*THREE, *DISTOPT, *flags, *save]
    configs["variable-distopt-dp2-balanced"] = [*THREE, *DISTOPT, *variable, *MODES["dp2-balanced"]]
    for name, flags in OVERLAPPED.items():
        configs[name] = [*THREE, *flags]
        configs[f"variable-{name}"] = [*THREE, *variable, *flags]
    for name, flags in PP2_OVERLAPPED.items():
        configs[name] = [*THREE, *flags]
    # Its shards follow the small buckets; a resume continues bit for bit.
    configs["overlap-distopt-balanced"] += ["--save", str(out / "ckpt" / "overlap"),
                                            "--save-interval", "2"]  # fmt: skip
    # The same checkpoint into a run whose buckets differ: refused before any shard is read.
    configs["one-bucket-loads-overlap"] = [*THREE, *DISTOPT, *BALANCED, "--load",
                                           str(out / "ckpt" / "overlap"), "--ckpt-step", "2"]  # fmt: skip
    configs["overlap-distopt-balanced-resumed"] = [
        *THREE, *OVERLAPPED["overlap-distopt-balanced"], "--load", str(out / "ckpt" / "overlap"),
        "--ckpt-step", "2",
    ]  # fmt: skip
    # Saved after an optimizer step whose updates no gather has fetched yet: the checkpoint
    # gathers them first.
    configs["gather-distopt-balanced"] += ["--save", str(out / "ckpt" / "gather"),
                                           "--save-interval", "2"]  # fmt: skip
    configs["gather-distopt-balanced-resumed"] = [
        *THREE, *OVERLAPPED["gather-distopt-balanced"], "--load", str(out / "ckpt" / "gather"),
        "--ckpt-step", "2",
    ]  # fmt: skip
    for mode in RESUMED:
        load = ["--load", str(out / "ckpt" / mode), "--ckpt-step", "2"]
        configs[f"distopt-{mode}-resumed"] = [*THREE, *DISTOPT, *MODES[mode], *load]
    model_only = ["--load", str(out / "ckpt" / "dp2"), "--ckpt-step", "2", "--no-load-optim"]
    configs["distopt-dp2-model-only"] = [*THREE, *DISTOPT, *model_only]
    configs["ddp-loads-distopt"] = [*THREE, "--load", str(out / "ckpt" / "dp2"), "--ckpt-step", "2"]
    configs["two-instances-load-one"] = [*THREE, *DISTOPT, *MODES["dp2-two-instances"], "--load",
                                         str(out / "ckpt" / "dp2"), "--ckpt-step", "2"]  # fmt: skip
    argv = [str(out)]
    for name, flags in configs.items():
        argv += [name, *TINY, *flags, "---"]
    proc = check(torchrun(2, OPTIM_WORKER, argv, timeout=600))
    (out / "launch.log").write_text(proc.stdout + proc.stderr)
    return out


WORLD4 = {
    "gather-dp2-pp2-balanced": [*GATHER, *BALANCED, *PP2],
    "gather-dp2-pp2-balanced-dynamic": [*GATHER, *BALANCED, *MODES["pp2-dynamic"]],
    "gather-dp2-pp2-alternate": [*GATHER, *BALANCED, *PP2, "--post-balance-alternate", "1"],
}
"""DP=2 x PP=2 (4 processes): whole-sample balancing with megatron-core's 1F1B and the runtime,
with both overlaps, where every stage gathers its parameters over its DP pair."""


@pytest.fixture(scope="module")
def world4_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("optim4")
    argv = [str(out)]
    for name, flags in WORLD4.items():
        argv += [name, *TINY, *THREE, *flags, "---"]
    check(torchrun(4, OPTIM_WORKER, argv, timeout=600))
    return out


def _merged(out: Path, name: str, nproc: int = 2):
    return merge([torch.load(out / name / f"rank{r}.pt") for r in range(nproc)])


def _learned(out: Path, name: str, nproc: int = 2):
    """Last gradients and final parameters, without the key biases (round-off only, see
    ``equivalence.without_key_biases``)."""
    grads, params, _ = _merged(out, name, nproc)
    grads, _ = without_key_biases(grads, HEADS, HEADS)
    params, _ = without_key_biases(params, HEADS, HEADS)
    return grads, params


COMPARED = {
    **{f"distopt-{mode}": "ddp" for mode in MODES},
    "variable-distopt-dp2-balanced": "variable-ddp",
    **{name: "ddp" for name in OVERLAPPED},
    **{f"variable-{name}": "variable-ddp" for name in OVERLAPPED},
    **{name: "ddp" for name in PP2_OVERLAPPED},
}
"""Each distributed-optimizer run and the DDP run it must learn the same as."""


@pytest.mark.parametrize("name", list(COMPARED))
def test_distributed_optimizer_learns_what_ddp_learns(runs, name):
    reference = COMPARED[name]
    records, ref_records = _records(runs / f"{name}.jsonl"), _records(runs / f"{reference}.jsonl")
    assert len(records) == 3
    # Losses, the optimizer's own gradient norm (summed over the shards), the last gradients
    # (gathered from the shards) and the updated parameters, within 1e-5.
    assert_trains_the_same(records, _learned(runs, name), ref_records, _learned(runs, reference))


def test_distributed_optimizer_runs_without_megatron_core_layout_warning(runs):
    # megatron-core 0.19.2 warns that DDP computes the distributed optimizer's parameter
    # layout itself; that layout is the one it would be given, so the note is debug-level.
    log = (runs / "launch.log").read_text()
    assert "full_param_layout" not in log, log[-3000:]


@pytest.mark.parametrize(
    "name", [*OVERLAPPED, *(f"variable-{n}" for n in OVERLAPPED), *PP2_OVERLAPPED]
)
def test_overlapped_reduction_starts_buckets_during_the_backward(runs, name):
    counts = [torch.load(runs / name / f"rank{r}.pt")["overlap"] for r in (0, 1)]
    buckets = counts[0][0]
    # megatron-core cuts only pipeline rank 0's gradients into buckets (one on later stages).
    assert buckets >= 4 and counts[1][0] == (1 if "pp2" in name else buckets), counts
    # Some buckets started before finalize_model_grads on every rank (so the reduction ran
    # beside the backward), and, in the balanced step, every one did: the step declares each
    # module final after its backward.
    assert all(early > 0 for _, early in counts), counts
    if "balanced" in name or "dynamic" in name:  # the runtime declares each chunk after it
        assert all(early == n for n, early in counts), counts


@pytest.mark.parametrize("name", ["overlap-ddp", "overlap-pp2-megatron", "overlap-pp2-dynamic"])
def test_buckets_start_in_the_order_the_backward_completes_them(runs, name):
    # The LLM's embeddings are registered after its layers but their gradients come last:
    # their buckets start after every LLM layer's (megatron-core's own order has them first,
    # which would hold every layer's bucket until the end of the backward).
    order = torch.load(runs / name / "rank0.pt")["bucket_order"]

    embedding = [i for i, b in enumerate(order) if any(n.startswith("llm.embedding.") for n in b)]
    # Buckets of the LLM's layers alone (one that also holds an encoder's head waits for it).
    layers = [i for i, b in enumerate(order) if all(n.startswith("llm.layers.") for n in b)]
    assert embedding and layers and min(embedding) > max(layers), order


GATHERED = [
    name for name in [*OVERLAPPED, *(f"variable-{n}" for n in OVERLAPPED), *PP2_OVERLAPPED]
    if "gather" in name
]  # fmt: skip
"""The runs with ``--overlap-param-gather``."""


@pytest.mark.parametrize("name", GATHERED)
def test_overlapped_param_gather_is_waited_for_in_the_forward(runs, name):
    counts = [torch.load(runs / name / f"rank{r}.pt")["param_gather"] for r in (0, 1)]
    grads = [torch.load(runs / name / f"rank{r}.pt")["overlap"][0] for r in (0, 1)]
    assert [n for n, _ in counts] == grads, counts  # as many buckets as the gradients have
    # The LLM's embeddings, registered after its layers, are gathered before them: its
    # forward needs them first.
    order = torch.load(runs / name / "rank0.pt")["gather_order"]
    embedding = [i for i, b in enumerate(order) if any(n.startswith("llm.embedding.") for n in b)]
    layers = [i for i, b in enumerate(order) if all(n.startswith("llm.layers.") for n in b)]
    assert embedding and layers and max(embedding) < min(layers), order
    if name == "gather-distopt-balanced":
        # It saved a checkpoint before the last step, which gathered the parameters: that
        # step had nothing left to gather.
        assert all(waited == 0 for _, waited in counts), counts
        return
    # In the last step every rank waited for some of the gathers in a forward pre-hook, so
    # they ran beside the earlier layers' compute.
    assert all(0 < waited for _, waited in counts), counts
    if name == "variable-gather-distopt":
        # Rank 1's batch holds no image and no audio: its encoders' gathers were waited for
        # at the end of the step, where megatron-core's own lazy dispatch would have
        # mismatched the ranks' collectives.
        (n0, waited0), (n1, waited1) = counts
        assert waited0 == n0 and waited1 < n1, counts


@pytest.mark.parametrize("name", list(WORLD4))
def test_dp2_pp2_with_overlapped_gathers_learns_what_ddp_learns(runs, world4_runs, name):
    records = _records(world4_runs / f"{name}.jsonl")
    assert len(records) == 3
    assert_trains_the_same(
        records, _learned(world4_runs, name, 4), _records(runs / "ddp.jsonl"), _learned(runs, "ddp")
    )
    counts = [torch.load(world4_runs / name / f"rank{r}.pt")["param_gather"] for r in range(4)]
    assert all(0 < waited for _, waited in counts), counts


def test_the_state_is_sharded_one_file_per_rank(runs):
    directory = runs / "ckpt" / "dp2" / "iter_0000002"
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["layout"] == {"tp": 1, "pp": 1, "dp": 2, "distributed_optimizer": True,
                                  "optimizer_instances": 1, "grad_buckets": None}  # fmt: skip
    sizes = _shard_sizes(directory)
    # Each rank holds about half of the main parameters and moments, not a replica.
    total = sum(p.numel() for p in torch.load(runs / "ddp" / "rank0.pt")["params"].values())
    assert sum(sizes) == total and abs(sizes[0] - sizes[1]) <= total // 10, (sizes, total)
    # With two instances of one rank each, every rank holds a whole copy.
    copies = runs / "ckpt" / "dp2-two-instances" / "iter_0000002"
    assert json.loads((copies / "manifest.json").read_text())["layout"]["optimizer_instances"] == 2
    assert _shard_sizes(copies) == [total, total]


def _shard_sizes(directory: Path) -> list[int]:
    """Per DP rank, the main parameters its shard file holds (every moment filled)."""
    sizes = []
    for r in (0, 1):
        (shard,) = torch.load(directory / "mp_rank_00" / f"distrib_optim_dp_{r:04d}.pt")
        entries = [e for buckets in shard[0].values() for bucket in buckets for e in bucket]
        sizes.append(sum(e["param"].numel() for e in entries))
        assert all(e["exp_avg_sq"].sum() > 0 for e in entries if e["param"].numel())
    return sizes


@pytest.mark.parametrize(
    "name",
    [
        *(f"distopt-{mode}" for mode in RESUMED),
        "overlap-distopt-balanced",
        "gather-distopt-balanced",
    ],
)
def test_a_resumed_run_continues_bit_for_bit(runs, name):
    full = _records(runs / f"{name}.jsonl")
    resumed = _records(runs / f"{name}-resumed.jsonl")
    assert [r["iteration"] for r in resumed] == [3]
    assert resumed[0]["lm_loss"] == full[2]["lm_loss"]
    assert resumed[0]["grad_norm"] == full[2]["grad_norm"]
    # The moments were restored: the last update, and so every parameter, is the same.
    params = _merged(runs, f"{name}-resumed")[1]
    ref_params = _merged(runs, name)[1]
    for name, p in params.items():
        assert torch.equal(p, ref_params[name]), name


def test_no_load_optim_restores_the_model_alone(runs):
    full = _records(runs / "distopt-dp2.jsonl")
    (resumed,) = _records(runs / "distopt-dp2-model-only.jsonl")
    # Iteration 3's loss comes before its update: the model alone decides it.
    assert resumed["iteration"] == 3 and resumed["lm_loss"] == full[2]["lm_loss"]


REFUSED = {
    "ddp-loads-distopt": "was saved with --use-distributed-optimizer, this run without it: "
    "resume with the saved optimizer, or pass --no-load-optim to keep only the model",
    "two-instances-load-one": "holds the distributed optimizer's shards of 1 instance(s) "
    "(--num-distributed-optimizer-instances); this run has 2: resume with the saved count (the "
    "shards are not resharded), or pass --no-load-optim to keep only the model",
}
"""Resumes of the DP=2 distributed optimizer's checkpoint that must be refused, and why."""


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_resume_with_another_optimizer_layout_is_refused_on_every_rank(runs, name):
    messages = [(runs / f"{name}.rank{r}.error").read_text() for r in (0, 1)]
    assert messages[0] == messages[1]
    assert messages[0] == f"{runs}/ckpt/dp2/iter_0000002 {REFUSED[name]}"


def test_a_resume_with_other_gradient_buckets_is_refused_on_every_rank(runs):
    messages = [(runs / f"one-bucket-loads-overlap.rank{r}.error").read_text() for r in (0, 1)]
    assert messages[0] == messages[1]
    assert messages[0] == (
        f"{runs}/ckpt/overlap/iter_0000002 holds the distributed optimizer's shards cut in "
        "buckets of 4000 parameters; this run cuts them in one bucket (no --overlap-grad-reduce): "
        "resume with the saved --overlap-grad-reduce and --ddp-bucket-size (the shards are not "
        "resharded), or pass --no-load-optim to keep only the model"
    )
