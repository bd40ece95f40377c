# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The ``layers`` stage: one module's chunks timed and fitted into its :class:`LayerTimeModel`.

Measured, for one module: middle blocks of 1 and 2 layers over the grid (the layers and the
chunk call), and the real first, last and whole chunks (``build_chunk``) on microbatches from
the trainer's ``build_microbatch`` over the edge grid (the input layer and the head; encoder
items pooled 4:1 and 1:1 into LLM rows). Everything is DDP-wrapped with the trainer's DDP
config and timed round-robin (:mod:`megatron.mllm.calibration.harness`); one joint fit
(:func:`~megatron.mllm.calibration.fit.fit_chunks`) gives every coefficient.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable, Sequence

import numpy as np
import torch

from megatron.mllm.batch import build_microbatch, thd_params
from megatron.mllm.calibration.fit import ChunkFit, chunk_features, fit_chunks
from megatron.mllm.calibration.harness import Prepare, Reference, ddp_wrap, measure_round_robin
from megatron.mllm.calibration.probes import SavedTensorTracker
from megatron.mllm.chunks import ChunkId, build_chunk, global_name
from megatron.mllm.init import init_module
from orchestration.calibration import LayerTimeModel
from orchestration.workload import Item, SampleMeta


def grid_points(
    lengths: Sequence[int], packs: Sequence[int], max_tokens: int
) -> list[tuple[int, int]]:
    """``(n, k)`` pairs of the grid: ``k`` packed sequences of ``n`` tokens, at most
    ``max_tokens`` in a call."""
    return [(n, k) for n in lengths for k in packs if n * k <= max_tokens]


def _sample(module: str, n: int, idx: int, pool: int = 4) -> SampleMeta:
    """A sample whose ``module`` work is one sequence/unit of ``n`` tokens (encoders: pooled
    ``pool``:1 into LLM rows)."""
    if module == "llm":
        return SampleMeta(f"cal-{idx}", text_tokens=n)
    item = Item(units=(n,), llm_tokens=max(1, n // pool))
    key = "image" if module == "vision" else "audio"
    return SampleMeta(f"cal-{idx}", text_tokens=4, **{key: (item,)})


def _middle_block(mllm, module: str, layers: int, pg):
    """A chunk's transformer block alone (no input layer, no head): what a chunk that holds
    neither end of its module runs, with ``layers`` layers (built as ``ModuleChunk`` builds it,
    for any module, even one with too few layers for a middle chunk)."""
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.mllm.specs import transformer_layer_spec

    config = mllm.chunk_config(module, layers)

    class Middle(MegatronModule):
        def __init__(self):
            super().__init__(config=config)
            self.block = TransformerBlock(
                config=config,
                spec=transformer_layer_spec(
                    mllm.use_te, causal=module == "llm", normalization=config.normalization
                ),
                pre_process=True,
                post_process=False,
                pg_collection=pg,
            )

    middle = Middle()
    # Initialised as the trainer's chunks are. Megatron's own initialisation is off in the
    # chunk configs (every chunk sets its parameters itself), so the block's parameters would
    # hold whatever memory it got: denormal and non-finite values, which made these points 1.5
    # to 7 times slower than the same layers in a chunk, by a different factor each run.
    init_module(
        middle,
        {n: global_name(module, 0, n) for n, _ in middle.named_parameters()},
        config,
        mllm.init_seed,
        mllm.num_layers(module),
        pg.tp.rank(),
        pg.tp.size(),
    )
    return middle


class _Points:
    """The points of one module's fit: how to run each, and its row of the fit."""

    def __init__(self, module: str, mllm, run, pg, device: torch.device):
        self.module, self.mllm, self.run, self.pg, self.device = module, mllm, run, pg, device
        enc = mllm.encoders.get(module)
        self.hidden = mllm.language.hidden_size if module == "llm" else enc.hidden_size
        self.dtype = mllm.language.params_dtype
        self.fns: list[Prepare] = []
        self.features: list[list[float]] = []
        self.keep: list = []  # the DDP wrappers: their hooks must live while the points run
        self.tensors: dict[tuple[int, int], tuple[int, int]] = {}

    def _hidden(self, tokens: int) -> torch.Tensor:
        return torch.randn(
            tokens, 1, self.hidden, device=self.device, dtype=self.dtype, requires_grad=True
        )

    def add_block(self, layers: int, points: Sequence[tuple[int, int]]) -> None:
        """A middle block of ``layers`` layers at each ``(n, k)`` point."""
        block = _middle_block(self.mllm, self.module, layers, self.pg).to(self.device)
        block.train()
        self.keep.append(ddp_wrap(block, self.run, self.pg))
        for n, k in points:
            lens = [n] * k
            psp = thd_params(lens, self.device)

            def fwd(measure_memory, lens=lens, psp=psp, block=block):
                x = self._hidden(sum(lens))
                rec = SavedTensorTracker(block.parameters())

                def run():
                    with _saving(rec, measure_memory):
                        out = block.block(x, attention_mask=None, packed_seq_params=psp)
                    return out, rec.alive

                return run

            self.fns.append(fwd)
            self.features.append(chunk_features(layers, lens, False, False, 0))

    def add_chunk(self, cid: ChunkId, task, points: Sequence[tuple[int, int]]) -> None:
        """A real chunk of the trainer on microbatches of the trainer's packing."""
        module = self.module
        chunk = build_chunk(self.mllm, cid, self.pg).to(self.device)
        chunk.train()
        self.keep.append(ddp_wrap(chunk, self.run, self.pg))
        names = [n for n, _ in chunk.named_parameters()]
        self.tensors[(cid.start, cid.stop)] = (
            sum(1 for n in names if not n.startswith("block.layers.")),
            sum(1 for n in names if n.startswith("block.layers.0.")),
        )
        # Encoder heads pool items into LLM rows: two pooling ratios separate the per-token
        # (pooling) from the per-row (projector) costs.
        pools = (4, 1) if chunk.is_last and module != "llm" else (4,)
        for n, k, pool in [(n, k, pool) for n, k in points for pool in pools]:
            samples = [_sample(module, n, i, pool) for i in range(k)]
            payloads = [task.payload(s, 1000 + i) for i, s in enumerate(samples)]
            mb = build_microbatch(
                list(zip(samples, payloads)), list(self.mllm.encoders), device=self.device
            )
            enc = mb.encoders.get(module)
            lens = list(enc.unit_lens if module != "llm" else mb.language.seq_lens)
            rows = enc.num_rows if module != "llm" else 0

            def fwd(measure_memory, chunk=chunk, mb=mb, enc=enc, lens=lens):
                hidden = None if chunk.is_first else self._hidden(sum(lens))
                rec = SavedTensorTracker(chunk.parameters())

                def run():
                    with _saving(rec, measure_memory):
                        if module == "llm":
                            out = chunk(hidden, mb.language, {})
                        else:
                            out = chunk(hidden, enc)
                    return out, rec.alive

                return run

            self.fns.append(fwd)
            self.features.append(
                chunk_features(cid.stop - cid.start, lens, chunk.is_first, chunk.is_last, rows)
            )


def _saving(rec: SavedTensorTracker, on: bool):
    """Count what autograd saves into ``rec`` when ``on`` (the timed passes run without hooks,
    as the trainer runs)."""
    return rec.hooks() if on else contextlib.nullcontext()


def calibrate_module(
    module: str,
    mllm,
    run,
    pg,
    task,
    device: torch.device,
    grid: Sequence[tuple[int, int]],
    edges: Sequence[tuple[int, int]],
    reps: int,
    ref: Reference,
    log: Callable[[str], None],
) -> tuple[LayerTimeModel, dict]:
    """Measure one module's chunks and fit its table (times in reference units).

    Args:
        module: ``llm`` or an encoder.
        mllm: the trainer's model config.
        run: the run config (its DDP config wraps what is timed).
        pg: megatron-core's process groups.
        task: the synthetic payloads of the edge microbatches.
        device: where to run.
        grid: ``(n, k)`` points of the layers (:func:`grid_points`).
        edges: ``(n, k)`` points of the whole chunks.
        reps: timed repetitions per point.
        ref: the reference pass.
        log: receives the fit's one-line summary.

    Returns:
        The table, and ``{"layer_flops_per_ref", "hidden_size"}`` for the compute efficiency.
    """
    total = mllm.num_layers(module)
    points = _Points(module, mllm, run, pg, device)
    points.add_block(1, grid)
    points.add_block(2, grid[::2])
    cids = {ChunkId(module, 0, 1), ChunkId(module, total - 1, total), ChunkId(module, 0, total)}
    for cid in sorted(cids, key=lambda c: (c.start, c.stop)):
        points.add_chunk(cid, task, edges)
    f, b, m = measure_round_robin(points.fns, device, reps, ref, desc=f"{module} repetitions")
    points.keep.clear()
    if os.environ.get("SEMU_CALIBRATION_DUMP"):  # raw points, for looking at the fit
        with open(os.environ["SEMU_CALIBRATION_DUMP"], "a", encoding="utf-8") as out:
            for x, tf, tb, tm in zip(points.features, f, b, m):
                out.write(json.dumps({"module": module, "x": x, "f": tf, "b": tb, "m": tm}) + "\n")
    fit = fit_chunks(points.features, f, b, m)
    err_f, err_b = fit.forward_errors, fit.backward_errors
    log(
        f"  {module}: {len(points.fns)} chunk shapes, fit error forward median "
        f"{np.median(err_f):.1%} (max {err_f.max():.1%}), backward median {np.median(err_b):.1%} "
        f"(max {err_b.max():.1%})"
    )
    table = _table(fit, points.tensors, total, float(sum(b) / max(sum(f), 1e-12)), edges)
    # Compute efficiency of the layer at the largest measured size (for the analytic model).
    shape = mllm.shape().module(module)
    big = [grid[-1][0]] * grid[-1][1]
    flops = shape.forward_flops(big, layers=1)
    # In reference units: divided by the reference's seconds once the calibration is done.
    info = {
        "layer_flops_per_ref": flops / max(table.forward_packed_s(big), 1e-12),
        "hidden_size": points.hidden,
    }
    return table, info


# The table's fitted fields: the fit they come from (forward, backward or memory) and its
# column (:data:`~megatron.mllm.calibration.fit.COLUMNS`).
_FITTED = {
    "forward": {"const_s": "layer", "linear_s": "layer_tok", "quadratic_s": "layer_sq",
                "per_sequence_s": "layer_seq", "input_const_s": "in", "input_s_per_token": "in_tok",
                "head_const_s": "head", "head_s_per_token": "head_tok",
                "head_s_per_row": "head_row", "chunk_const_s": "chunk"},
    "backward": {"backward_const_s": "layer", "backward_linear_s": "layer_tok",
                 "backward_quadratic_s": "layer_sq", "backward_per_sequence_s": "layer_seq",
                 "input_backward_const_s": "in", "input_backward_s_per_token": "in_tok",
                 "head_backward_const_s": "head", "head_backward_s_per_token": "head_tok",
                 "head_backward_s_per_row": "head_row", "backward_chunk_const_s": "chunk"},
    "memory": {"act_bytes_per_token": "layer_tok", "act_bytes_per_token_sq": "layer_sq",
               "input_act_bytes_per_token": "in_tok", "head_act_bytes_per_token": "head_tok",
               "head_act_bytes_per_row": "head_row"},
}  # fmt: skip


def _table(
    fit: ChunkFit, tensors: dict, total: int, ratio: float, edges: Sequence[tuple[int, int]]
) -> LayerTimeModel:
    """The module's table from its fit and its chunks' parameter tensors."""
    fitted = {
        name: getattr(fit, which)[column]
        for which, fields in _FITTED.items()
        for name, column in fields.items()
    }
    head_tensors, _ = tensors[(total - 1, total)]
    input_tensors, layer_tensors = tensors[(0, 1)]
    if total == 1:  # one chunk holds both ends: its non-layer tensors count once
        input_tensors = 0

    def per_token_edge(which: str) -> float:
        # For readers of the per-token summary only (the balancer's cost model): the edge's
        # forward per token at a typical size of the grid, its fixed cost included.
        n = float(np.median([p[0] * p[1] for p in edges]))
        return fit.forward[which] / n + fit.forward[which + "_tok"]

    return LayerTimeModel(
        **fitted,
        backward_ratio=ratio,
        edge_s_per_token=per_token_edge("head") + (per_token_edge("in") if total > 1 else 0),
        layer_param_tensors=layer_tensors,
        input_param_tensors=input_tensors,
        head_param_tensors=head_tensors,
    )
