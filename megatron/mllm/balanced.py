# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchMLLM in the trainer: batch post-balancing of every phase across data-parallel ranks.

After each DP rank has loaded its samples (Megatron's order), the ranks all-gather the metadata,
compute the same plan (``orchestration.plan``) and move the work with all-to-all
(``orchestration.dispatcher``). Moving work never changes what is learned: the loss is
normalised by the global number of loss tokens, and every sample is processed exactly once.

**PP = 1 (per-phase mode).** Each encoder phase and the LLM phase get their own plan:

1. encoder inputs (pixels, frame features) go from the loader to the encoder-phase worker;
2. each worker runs the encoder body on its units, packed, once per iteration;
3. the unit outputs travel, through an autograd-aware all-to-all, straight to the LLM-phase
   worker of their sample, which pools and projects each item (the head needs whole items);
4. token ids go from the loader to the LLM-phase worker, which forms balanced microbatches
   within the packing limit and runs the LLM forward and backward on each;
5. the gradients of the unit outputs return through the transposed all-to-all, once, and the
   encoder backward runs on the worker; finally megatron-core's ``finalize_model_grads``.

Every rank joins every collective, even with no units of a modality. Encoder outputs of all
microbatches are held as one leaf tensor, so the backward exchange runs once per phase, not
once per microbatch (ranks may have different numbers of microbatches).

**PP > 1 (whole-sample mode).** Whole samples move across DP groups to balance the predicted
cost of each group's batch; inside the group, megatron-core's pipeline schedule runs
microbatches formed by cost within the packing limit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from megatron.mllm.batch import SamplePayload, build_microbatch
from orchestration.balance import max_over_mean
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.metadata import GatheredMetadata, encode_rank_metadata, phase_items
from orchestration.microbatches import form_microbatches
from orchestration.phase_plan import plan_iteration
from orchestration.routing import Route as Exchange
from orchestration.routing import row_index
from orchestration.sample_plan import plan_whole_samples
from orchestration.workload import MODALITIES, Item, SampleMeta

POST_BALANCE_ALGORITHMS = {"lpt": "lpt+refine", "kk": "kk+refine", "auto": "auto"}
"""``--post-balance`` choices and the ``orchestration.balance`` algorithm each runs."""


@dataclass
class BalanceStats:
    """What balancing did in one iteration, for the log line and metrics."""

    imbalance_before: dict[str, float] = field(default_factory=dict)
    """Per phase, predicted max/mean load across DP ranks without balancing."""

    imbalance_after: dict[str, float] = field(default_factory=dict)
    """Per phase, the same with the plan."""

    bytes_moved: int = 0
    """Payload and activation bytes that crossed ranks (all ranks, forward and backward)."""

    moved_fraction: dict[str, float] = field(default_factory=dict)
    """Per phase, the fraction of items that changed rank."""

    num_microbatches: int = 0
    """Microbatches this rank ran."""


def sample_from_table(md: GatheredMetadata, s: int, sample_id: str) -> SampleMeta:
    """Rebuild the metadata of global sample ``s`` from the gathered table."""
    items: dict[str, list[Item]] = {m: [] for m in MODALITIES}
    # Items are sorted by sample and units by item (canonical order): slice, don't scan.
    lo, hi = np.searchsorted(md.item_sample, [s, s + 1])
    for i in range(int(lo), int(hi)):
        a, b = np.searchsorted(md.unit_item, [i, i + 1])
        units = tuple(int(u) for u in md.unit_tokens[a:b])
        items[MODALITIES[int(md.item_modality[i])]].append(Item(units, int(md.item_llm[i])))
    return SampleMeta(sample_id, int(md.sample_text[s]), **{m: tuple(v) for m, v in items.items()})


def _arrival(ex: Exchange, rank: int) -> np.ndarray:
    """Items of ``ex`` arriving at ``rank``, in receive-buffer order (source, then position)."""
    sel = np.flatnonzero(ex.dst == rank)
    return sel[np.lexsort((ex.dst_pos[sel], ex.src[sel]))]


class PostBalancer:
    """Plans and carries out batch post-balancing for one rank of the trainer."""

    def __init__(self, trainer, algorithm: str, phases, node_wise: bool, gpus_per_node: int,
                 check_digest: bool, caps: dict[str, int] | None, calibration=None):  # fmt: skip
        self.trainer = trainer
        self.algorithm = POST_BALANCE_ALGORITHMS[algorithm]
        self.phases = phases
        self.check = check_digest
        self.caps = caps or {}
        self.gpus_per_node = gpus_per_node
        pg = trainer.pg_collection
        self.dispatcher = Dispatcher(pg.dp, node_wise=node_wise, gpus_per_node=gpus_per_node)
        self.me = self.dispatcher.rank
        self.cost_model = CostModel.build(trainer.shape, calibration)

    # ---------------------------------------------------------------------- shared pieces

    def gather(self, local: list[tuple[int, SampleMeta]]) -> tuple[GatheredMetadata, list[str]]:
        """All-gather every DP rank's metadata (int arrays) and sample ids."""
        flat = self.dispatcher.all_gather_arrays(encode_rank_metadata(local))
        ids = self.dispatcher.all_gather_strings([meta.sample_id for _, meta in local])
        md = GatheredMetadata.from_flat(flat, sample_ids=ids)
        return md, list(ids)

    def _check(self, digest: str) -> None:
        if self.check:
            self.dispatcher.check_digest(digest)

    def _exchange_rows(self, ex: Exchange, local_rows: torch.Tensor, local_sizes: np.ndarray,
                       autograd: bool = False) -> torch.Tensor:  # fmt: skip
        """Send each local item's rows where ``ex`` says; return arrivals in arrival order."""
        idx = row_index(ex.send_index(self.me), local_sizes)
        send = local_rows.index_select(0, torch.as_tensor(idx, device=local_rows.device))
        if autograd:
            return self.dispatcher.all_to_all(send, ex.rows_matrix(), differentiable=True)
        return self.dispatcher.all_to_all(send, ex.rows_matrix())

    # ---------------------------------------------------------------------- PP = 1

    def forward_backward(self, local: list[tuple[int, SampleMeta]]):
        """One iteration's forward and backward on this rank, balanced per phase.

        Returns:
            (loss dicts per microbatch, :class:`BalanceStats`), like megatron-core's schedules
            return their ``forward_data_store``.
        """
        tr = self.trainer
        model = tr.model
        device = tr.device
        config = tr.mllm.language
        encoders = list(tr.mllm.encoders)
        md, ids = self.gather(local)
        plan = plan_iteration(
            md,
            self.cost_model,
            algorithm=self.algorithm,
            phases=self.phases,
            caps=self.caps,
            gpus_per_node=self.gpus_per_node,
        )
        self._check(plan.digest)
        self.dispatcher.reset_counters()
        stats = BalanceStats()
        for p in plan.phases:
            stats.imbalance_before[p.phase] = p.imbalance_before
            stats.imbalance_after[p.phase] = p.imbalance_after
            stats.moved_fraction[p.phase] = p.moved_fraction

        payloads = [tr.task.payload(meta, k, with_features=True) for k, meta in local]
        no_sync = config.no_sync_func if config.no_sync_func is not None else contextlib.nullcontext
        with no_sync():
            # Encoder phases: inputs to workers, bodies, outputs to the LLM-phase workers.
            sent_out: dict[str, torch.Tensor] = {}
            leaves: dict[str, torch.Tensor] = {}
            leaf_offsets: dict[str, dict[int, tuple[int, int]]] = {}
            for enc in encoders:
                phase = plan.phase(enc)
                dim = tr.mllm.encoders[enc].input_dim
                units = [u for p in payloads for u in p.units.get(enc, [])]
                feats = (
                    torch.from_numpy(np.concatenate(units)).to(device)
                    if units
                    else torch.zeros(0, dim, device=device)
                )
                local_sizes = phase.items.tokens[phase.dispatch.src_items(self.me)]
                got = self._exchange_rows(phase.dispatch, feats, local_sizes)
                mine = phase.dispatch.dst_items(self.me)
                lens = [int(n) for n in phase.items.tokens[mine]]
                encoder = model.encoders[enc]
                if lens:
                    positions = torch.cat([torch.arange(n, device=device) for n in lens])
                    batch = _unit_batch(lens, device)
                    hidden = encoder.body(None, got, positions, batch).squeeze(1)
                else:
                    hidden = torch.zeros(0, encoder.config.hidden_size, device=device,
                                         dtype=config.params_dtype, requires_grad=True)  # fmt: skip
                to_llm = plan.to_llm[enc]
                arrived = self._exchange_rows(to_llm, hidden, np.asarray(lens, dtype=np.int64),
                                              autograd=True)  # fmt: skip
                # Reorder arrivals into the destination list: per sample, its units in order.
                order = _arrival(to_llm, self.me)
                rows = to_llm.rows[order]
                by_dst = np.argsort(to_llm.dst_pos[order], kind="stable")
                perm = row_index(by_dst, rows)
                arrived = arrived.index_select(0, torch.as_tensor(perm, device=device))
                sent_out[enc] = arrived
                leaves[enc] = arrived.detach().requires_grad_(True)
                # Row range of each of this worker's samples' units.
                dst_items = order[by_dst]
                offsets, start = {}, 0
                for item, n in zip(dst_items.tolist(), rows[by_dst].tolist()):
                    s = int(phase.items.sample[item])
                    a, b = offsets.get(s, (start, start))
                    offsets[s] = (a, b + n)
                    start += n
                leaf_offsets[enc] = offsets

            # LLM phase: token ids to the workers, balanced microbatches, forward and backward.
            llm = plan.phase("llm")
            tokens = torch.from_numpy(np.concatenate([p.tokens for p in payloads])).to(device)
            local_sizes = llm.items.tokens[llm.dispatch.src_items(self.me)]
            got_tokens = self._exchange_rows(llm.dispatch, tokens.view(-1, 1), local_sizes)
            mine = llm.dispatch.dst_items(self.me)
            samples, start = [], 0
            for item in mine.tolist():
                s = int(llm.items.sample[item])
                meta = sample_from_table(md, s, ids[s])
                n = meta.llm_tokens
                toks = got_tokens[start : start + n, 0].cpu().numpy()
                samples.append((s, meta, SamplePayload(tokens=toks)))
                start += n
            mb_plan = form_microbatches(
                llm.costs[mine],
                llm.items.tokens[mine],
                tr.num_microbatches,
                tr.args.micro_batch_size * tr.args.seq_length,
                labels=[f"sample {ids[s]!r}" for s, _, _ in samples],
            )
            stats.num_microbatches = mb_plan.num_microbatches
            losses = []
            total_tokens = torch.zeros([], dtype=torch.int, device=device)
            for mb in mb_plan.microbatches:
                chosen = [samples[i] for i in mb]
                batch = build_microbatch(
                    [(meta, payload) for _, meta, payload in chosen],
                    encoders,
                    device=device,
                    with_features=False,
                )
                outputs = {}
                for enc, enc_batch in batch.encoders.items():
                    idx = np.concatenate(
                        [
                            np.arange(*leaf_offsets[enc][s])
                            for s, _, _ in chosen
                            if s in leaf_offsets[enc]
                        ]
                    )
                    hidden = leaves[enc].index_select(0, torch.as_tensor(idx, device=device))
                    outputs[enc] = model.encoders[enc].head(hidden, enc_batch)
                output = model.language(None, batch.language, outputs)
                loss, num_tokens, report = tr._loss_func(batch.language.loss_mask, output)
                if config.grad_scale_func is not None:
                    loss = config.grad_scale_func(loss)
                loss.backward()
                total_tokens += num_tokens
                losses.append(report)
            # Encoder backward: gradients of the unit outputs go back once per phase.
            for enc in encoders:
                grad = leaves[enc].grad
                if grad is None:
                    grad = torch.zeros_like(leaves[enc])
                torch.autograd.backward(sent_out[enc], grad)
        if config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func(
                [tr.ddp_model],
                total_tokens if config.calculate_per_token_loss else None,
                pg_collection=tr.pg_collection,
            )
        stats.bytes_moved = self.dispatcher.bytes_moved
        return losses, stats

    # ---------------------------------------------------------------------- PP > 1

    def whole_sample_microbatches(self, local: list[tuple[int, SampleMeta]]):
        """Re-assign whole samples across DP groups; return this group's packed microbatches."""
        tr = self.trainer
        encoders = list(tr.mllm.encoders)
        md, ids = self.gather(local)
        plan = plan_whole_samples(md, self.cost_model, algorithm=self.algorithm)
        self._check(plan.digest)
        self.dispatcher.reset_counters()
        with_features = tr.needs_features
        payloads = [tr.task.payload(meta, k, with_features=with_features) for k, meta in local]
        ex = plan.dispatch
        mine = ex.dst_items(self.me)
        # Token ids (every stage builds labels and shapes from them).
        tokens = torch.from_numpy(np.concatenate([p.tokens for p in payloads]))
        local_sizes = ex.rows[ex.src_items(self.me)]
        got_tokens = self._exchange_rows(ex, tokens.view(-1, 1), local_sizes)[:, 0].numpy()
        feats: dict[str, np.ndarray] = {}
        if with_features:
            for enc in encoders:
                # Feature rows of every sample: its encoder tokens of this encoder.
                units = phase_items(md, enc)
                sample_rows = np.bincount(
                    units.sample, weights=units.tokens, minlength=md.num_samples
                ).astype(np.int64)
                dim = tr.mllm.encoders[enc].input_dim
                parts = [u for p in payloads for u in p.units.get(enc, [])]
                rows = torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros(0, dim)
                got = self._exchange_rows(
                    ex.with_rows(sample_rows), rows, sample_rows[ex.src_items(self.me)]
                )
                feats[enc] = got.numpy()
        samples, t0, f0 = [], 0, {e: 0 for e in encoders}
        for item in mine.tolist():
            s = int(plan.items.sample[item])
            meta = sample_from_table(md, s, ids[s])
            n = meta.llm_tokens
            payload = SamplePayload(tokens=got_tokens[t0 : t0 + n])
            t0 += n
            if with_features:
                for enc in encoders:
                    lens = meta.encoder_units(enc)
                    parts = []
                    for u in lens:
                        parts.append(feats[enc][f0[enc] : f0[enc] + u])
                        f0[enc] += u
                    if parts:
                        payload.units[enc] = parts
            samples.append((s, meta, payload))
        tokens_limit = tr.args.micro_batch_size * tr.args.seq_length
        mb_plan = form_microbatches(
            plan.costs[mine],
            plan.items.tokens[mine],
            tr.num_microbatches,
            tokens_limit,
            labels=[f"sample {ids[s]!r}" for s, _, _ in samples],
        )
        microbatches = [
            tr.pack([(samples[i][1], samples[i][2]) for i in mb]) for mb in mb_plan.microbatches
        ]
        stats = BalanceStats(
            imbalance_before={"groups": plan.imbalance_before},
            imbalance_after={"groups": plan.imbalance_after},
            moved_fraction={"samples": ex.moved_items / max(1, ex.size)},
            num_microbatches=len(microbatches),
        )
        for phase in plan.phase_costs:
            before = plan.phase_loads(phase, after=False)
            after = plan.phase_loads(phase, after=True)
            stats.imbalance_before[phase] = max_over_mean(before)
            stats.imbalance_after[phase] = max_over_mean(after)
        stats.bytes_moved = self.dispatcher.bytes_moved
        return microbatches, stats


def _unit_batch(lens: list[int], device):
    from megatron.mllm.batch import _packed_seq_params

    return _packed_seq_params(lens, device)
