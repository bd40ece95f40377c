# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Equivalence helpers: gradients and parameters of any layout, merged by global name.

Every layout, schedule and balancing mode must learn exactly what one process learns from the
same global batch: same initial weights (bit for bit), same loss, same gradients (1e-5
relative), and over several optimizer steps the same reported losses and gradient norms and the
same parameters (``test_golden_losses.py``). Configurations of one world size run in one launch
(``grad_worker.py``, ``train_worker.py``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from launch import check, torchrun

GRAD_WORKER = Path(__file__).with_name("grad_worker.py")

# A tiny model on the default workload: every module (vision, audio, LLM) gets work, and every
# module has enough layers to be cut into 2 stages x 2 chunks.
TINY = [
    "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
    "--seq-length", "256", "--max-position-embeddings", "256", "--vocab-size", "256",
    "--vision-num-layers", "2", "--vision-patch-size", "2", "--audio-num-layers", "2",
    "--audio-feature-dim", "16", "--workload-token-scale", "0.03125",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "1",
    "--lr", "1e-3", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--synthetic-num-classes", "8",
]  # fmt: skip

# Variable shapes in one step. With 2 samples per microbatch and DP=1 the microbatches hold
# 6 images and no audio; nothing but text; 2 images and audio; text only. With DP=2, rank 1
# (Megatron's order: samples 2, 3, 6, 7) loads no image and no audio at all.
VARIABLE_JSONL = """\
{"id": "img-a", "text_tokens": 20, "image": [{"units": [16, 16], "llm_tokens": 8}]}
{"id": "img-b", "text_tokens": 9, "image": [24, 8, 12, {"units": [40], "llm_tokens": 10}, 6]}
{"id": "txt-c", "text_tokens": 30}
{"id": "txt-d", "text_tokens": 12}
{"id": "img-e", "text_tokens": 5, "image": [{"units": [64], "llm_tokens": 16}], \
"audio": [{"units": [47, 47], "llm_tokens": 20}]}
{"id": "img-f", "text_tokens": 40, "image": [{"units": [32], "llm_tokens": 8}]}
{"id": "txt-g", "text_tokens": 7}
{"id": "txt-h", "text_tokens": 64}
"""


def variable_workload(directory: Path) -> list[str]:
    """Flags that train on :data:`VARIABLE_JSONL` (written into ``directory``)."""
    path = directory / "variable.jsonl"
    path.write_text(VARIABLE_JSONL)
    return ["--workload", str(path), "--workload-token-scale", "1"]


FULL_SHAPES: dict[str, torch.Size] = {}
"""Unsharded shape of every parameter (from the TP=1 reference), to merge TP shards."""

PEAK_SAVED_BYTES: dict[str, list[int]] = {}
"""Per ``memory-`` configuration run by :func:`run_configs`, each rank's peak of activation
bytes kept for backward during the step (``grad_worker.py`` counts them)."""


def run_configs(
    tmp_path: Path, nproc: int, configs: dict[str, list[str]], tp: dict[str, int] | None = None
) -> dict[str, tuple[dict, dict, torch.Tensor]]:
    """Run configurations of one world size in one launch; merge each over its ranks.

    Returns:
        Per configuration name: (gradients, initial parameters, [loss sum, tokens]).
    """
    argv = [str(tmp_path)]
    for name, flags in configs.items():
        argv += [name, *TINY, *flags, "---"]
    check(torchrun(nproc, GRAD_WORKER, argv, timeout=600))
    for name in configs:
        if name.startswith("memory-"):
            PEAK_SAVED_BYTES[name] = [
                torch.load(tmp_path / name / f"rank{r}.pt")["peak_saved_bytes"]
                for r in range(nproc)
            ]
    return {
        name: merge([torch.load(tmp_path / name / f"rank{r}.pt") for r in range(nproc)],
                    (tp or {}).get(name, 1))  # fmt: skip
        for name in configs
    }


def merge(
    data: list[dict], tp: int = 1, full_shapes: dict[str, torch.Size] | None = None
) -> tuple[dict, dict, torch.Tensor]:
    """Merge ranks' files by global name; TP shards are concatenated, DP replicas must agree.

    With TP, rank ``r`` holds shard ``r % tp``; a shard is concatenated along the dimension
    where its shape differs from the full tensor's (``full_shapes``, by default
    :data:`FULL_SHAPES`).
    """
    full_shapes = FULL_SHAPES if full_shapes is None else full_shapes
    grads, params, loss = {}, {}, None
    for r in range(0, len(data), tp):  # one TP group at a time
        group = data[r : r + tp]
        for key, merged in (("grads", grads), ("params", params)):
            for name in group[0][key]:
                shards = [d[key][name] for d in group]
                full = shards[0]
                if name in full_shapes and full.shape != full_shapes[name]:
                    dim = next(
                        i for i in range(full.dim()) if full.shape[i] != full_shapes[name][i]
                    )
                    full = torch.cat(shards, dim)
                if name in merged:  # replicated over DP: replicas agree
                    torch.testing.assert_close(full, merged[name], rtol=1e-6, atol=0)
                merged[name] = full
        loss = next((d["loss"] for d in group if d["loss"] is not None), loss)
    return grads, params, loss


def relative_difference(tensor: torch.Tensor, reference: torch.Tensor) -> float:
    """``|tensor - reference| / |reference|`` (Frobenius norms)."""
    return float((tensor - reference).norm() / reference.norm().clamp_min(1e-30))


def assert_equivalent(run, reference) -> None:
    """Same initial weights, loss within 1e-6 and every gradient within 1e-5 (relative)."""
    grads, params, loss = run
    ref_grads, ref_params, ref_loss = reference
    assert set(grads) == set(ref_grads), set(grads) ^ set(ref_grads)
    for name, p in params.items():
        assert torch.equal(p, ref_params[name]), f"initial weights of {name} differ"
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    for name, g in grads.items():
        rel = relative_difference(g, ref_grads[name])
        assert rel <= 1e-5, f"{name}: relative gradient difference {rel:.2e}"


def assert_trains_the_same(
    records, learned, ref_records, ref_learned, rtol=1e-5, param_rtol=None
) -> None:
    """Several iterations with optimizer steps learn what the reference learns.

    The same samples and tokens every iteration; the trainer's reported loss and gradient norm
    of every iteration, the last iteration's gradients and every parameter after the last step
    within ``rtol`` (relative).

    Args:
        records: the run's ``--metrics-jsonl`` records, one per iteration.
        learned: ``(gradients, parameters)``: its last gradients and final parameters by
            global name (:func:`merge`'s first two).
        ref_records: the reference's records.
        ref_learned: the reference's ``(gradients, parameters)``.
        rtol: the bound of everything compared.
        param_rtol: the final parameters' own bound (default ``rtol``).
    """
    assert len(records) == len(ref_records), (len(records), len(ref_records))
    for i, (record, ref) in enumerate(zip(records, ref_records)):
        batch, ref_batch = (record["samples"], record["tokens"]), (ref["samples"], ref["tokens"])
        assert batch == ref_batch, f"iteration {i}: (samples, tokens) {batch} != {ref_batch}"
        for field in ("lm_loss", "grad_norm"):
            rel = abs(record[field] - ref[field]) / abs(ref[field])
            assert rel <= rtol, f"iteration {i}: {field} {record[field]} vs {ref[field]}"
    bounds = (rtol, rtol if param_rtol is None else param_rtol)
    for kind, tensors, ref_tensors, bound in zip(
        ("gradient", "parameter"), learned, ref_learned, bounds
    ):
        assert set(tensors) == set(ref_tensors), f"{kind}s: {set(tensors) ^ set(ref_tensors)}"
        off = {
            name: rel
            for name, t in tensors.items()
            if (rel := relative_difference(t, ref_tensors[name])) > bound
        }
        assert not off, f"{kind}s beyond {bound:g} (relative): {off}"


def without_key_biases(
    tensors: dict[str, torch.Tensor], heads: int, groups: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every attention's qkv bias without its key slices, and those slices apart, by name.

    Adding the same score to every key of a query leaves the softmax unchanged, so the key bias
    gets no gradient in exact arithmetic: it gets round-off instead (about 1e-11 here), which
    Adam turns into updates that differ from layout to layout and that the loss cannot see.
    megatron-core lays the qkv bias out per query group as ``[query heads, key, value]``, each
    one head wide.

    Args:
        tensors: parameters or gradients by global name.
        heads: attention heads of every attention.
        groups: query groups of every attention.
    """
    out, keys = dict(tensors), {}
    for name, t in tensors.items():
        if name.endswith("self_attention.linear_qkv.bias"):
            per_group = t.view(groups, heads // groups + 2, -1)
            keys[name] = per_group[:, -2]
            out[name] = torch.cat([per_group[:, :-2], per_group[:, -1:]], 1).flatten()
    return out, keys
