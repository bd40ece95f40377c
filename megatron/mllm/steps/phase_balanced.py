# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchMLLM's per-phase batch post-balancing as a training step (PP = 1).

After each DP rank has loaded its samples (Megatron's order), every phase (each encoder, then
the LLM) gets its own plan over the all-gathered metadata (``orchestration.phase_plan``), and
the dispatcher moves the work with all-to-all:

1. encoder inputs (pixels, frame features) go from the loader to the encoder-phase worker;
2. each worker runs the encoder body on its units, packed, once per iteration;
3. the unit outputs travel, through an autograd-aware all-to-all, straight to the LLM-phase
   worker of their sample, which pools and projects each item (the head needs whole items);
4. token ids go from the loader to the LLM-phase worker, which forms balanced microbatches
   within the packing limit and runs forward and backward on each with megatron-core's
   ``forward_step``/``backward_step`` (so the loss and gradient-scaling contract is Megatron's);
5. the gradients of the unit outputs return through the transposed all-to-all, once, and the
   encoder backward runs on the worker; finally megatron-core's ``finalize_model_grads``.

Every rank joins every collective, even with no units of a modality. Encoder outputs of all
microbatches are held as one leaf tensor, so the backward exchange runs once per phase, not
once per microbatch (ranks may have different numbers of microbatches). Moving work never
changes what is learned: the loss is normalised by the global number of loss tokens.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from megatron.core.pipeline_parallel.schedules import backward_step, forward_step
from megatron.core.utils import get_attr_wrapped_model, get_model_config
from megatron.mllm.batch import SamplePayload, build_microbatch, thd_params
from megatron.mllm.config import MLLMConfig
from megatron.mllm.steps.base import BalancedStep, BalanceStats, take
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.phase_plan import IterationPlan, plan_iteration


class PhaseBalancedStep(BalancedStep):
    """Per-phase post-balancing with PP = 1 (see the module docstring)."""

    def __init__(self, run, mllm: MLLMConfig, dispatcher: Dispatcher, cost_model: CostModel,
                 pg_collection, device: torch.device):  # fmt: skip
        """Args: those of :class:`BalancedStep`, and ``pg_collection``, megatron-core's process
        groups (for ``finalize_model_grads``)."""
        super().__init__(run, mllm, dispatcher, cost_model, device)
        self.pg_collection = pg_collection

    def describe(self) -> str:
        text = self.describe_balance(f"per phase {self.balance.balance_phases}")
        return text + " | schedule: orchestrated two-hop (encoders, then LLM microbatches)"

    def plan(self, batch) -> IterationPlan:
        """This iteration's plan (the same on every DP rank)."""
        b = self.balance
        return self.plan_within_caps(
            plan_iteration, batch.metadata, phases=b.balance_phases, gpus_per_node=b.gpus_per_node
        )

    def __call__(self, *, forward_step_func, data_iterator, model, num_microbatches: int,
                 forward_only: bool = False, collect_non_loss_data: bool = False,
                 **unused) -> list:  # fmt: skip
        loaded = take(data_iterator, num_microbatches)
        batch = loaded[0].batch
        local = [s for mb in loaded for s in mb.samples]
        disp = self.dispatcher
        me = disp.rank
        with self.timers.span("plan"):
            plan = self.plan(batch)
        self.begin(plan.digest)
        stats = BalanceStats()
        for p in plan.phases:
            stats.imbalance_before[p.phase] = p.imbalance_before
            stats.imbalance_after[p.phase] = p.imbalance_after
            stats.moved_fraction[p.phase] = p.moved_fraction
            stats.predicted_loads[p.phase] = [float(x) for x in p.loads_after]
            stats.predicted_loads_before[p.phase] = [float(x) for x in p.loads_before]
            stats.unit = p.unit
        config = get_model_config(model[0])
        encoders = get_attr_wrapped_model(model[0], "encoders")
        no_sync = config.no_sync_func if config.no_sync_func is not None else contextlib.nullcontext
        grad = contextlib.nullcontext() if not forward_only else torch.no_grad()
        losses: list = []
        with no_sync(), grad:
            sent, leaves, sample_rows = {}, {}, {}
            for enc in self.mllm.encoders:
                sent[enc], sample_rows[enc] = self._encoder_phase(
                    plan, enc, encoders[enc], local, forward_only
                )
                leaves[enc] = sent[enc].detach().requires_grad_(not forward_only)
            samples = self._llm_samples(plan, batch.metadata, local)
            llm = plan.phase("llm")
            mine = llm.dispatch.dst_items(me)
            with self.timers.span("microbatches"):
                mb_plan = self.form_microbatches(
                    llm.costs[mine],
                    llm.items.tokens[mine],
                    num_microbatches,
                    samples,
                    batch.metadata.sample_ids,
                )
            stats.num_microbatches = mb_plan.num_microbatches
            # Built one at a time: each holds a copy of its samples' encoder rows.
            microbatches = (
                self._llm_microbatch([samples[j] for j in mb], leaves, sample_rows)
                for mb in mb_plan.microbatches
            )
            total_tokens = torch.zeros([], dtype=torch.int, device=self.device)
            with self.timers.span("llm-microbatches"):
                for i, packed in enumerate(microbatches):
                    output, num_tokens = forward_step(
                        forward_step_func, iter([packed]), model[0], mb_plan.num_microbatches,
                        None, losses, config, 1, collect_non_loss_data=collect_non_loss_data,
                        is_first_microbatch=i == 0, current_microbatch=i, is_last_stage=True,
                    )  # fmt: skip
                    total_tokens += num_tokens
                    if not forward_only:
                        backward_step(None, output, None, config)
            if not forward_only:
                # Encoder backward: gradients of the unit outputs go back once per phase.
                for enc in self.mllm.encoders:
                    g = leaves[enc].grad
                    if g is None:  # no microbatch of this worker used the encoder's outputs
                        g = torch.zeros_like(leaves[enc])
                    with self.timers.span("encoder-backward", detail=enc):
                        torch.autograd.backward(sent[enc], g)
        if not forward_only and config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func(
                model,
                total_tokens if config.calculate_per_token_loss else None,
                pg_collection=self.pg_collection,
            )
        stats.bytes_moved = disp.bytes_moved
        self.balance_stats = stats
        return losses

    def _encoder_phase(self, plan: IterationPlan, enc: str, encoder, local, forward_only: bool):
        """Inputs to the workers, the encoder body there, outputs to the LLM-phase workers.

        Returns:
            The unit outputs that arrived here, in destination order (per sample of this LLM
            worker, its units in order), and each sample's row range among them.
        """
        disp, me, device = self.dispatcher, self.dispatcher.rank, self.device
        phase = plan.phase(enc)
        units = [u for s in local for u in s.payload.units.get(enc, [])]
        dim = self.mllm.encoders[enc].input_dim
        feats = (
            torch.from_numpy(np.concatenate(units)).to(device)
            if units
            else torch.zeros(0, dim, device=device)
        )
        sizes = phase.items.tokens[phase.dispatch.src_items(me)]
        got = disp.move(phase.dispatch, feats, sizes, label=f"{enc} inputs")
        lens = [int(n) for n in phase.items.tokens[phase.dispatch.dst_items(me)]]
        if lens:
            positions = torch.cat([torch.arange(n, device=device) for n in lens])
            with self.timers.span("encoder-forward", detail=enc):
                hidden = encoder.body(None, got, positions, thd_params(lens, device)).squeeze(1)
        else:
            hidden = torch.zeros(0, encoder.config.hidden_size, device=device,
                                 dtype=encoder.config.params_dtype,
                                 requires_grad=not forward_only)  # fmt: skip
        arrived = disp.move(
            plan.to_llm[enc],
            hidden,
            np.asarray(lens, dtype=np.int64),
            differentiable=not forward_only,
            label=f"{enc} outputs",
        )
        arrivals = plan.encoder_arrivals(enc, me)
        arrived = arrived.index_select(0, torch.as_tensor(arrivals.order, device=device))
        return arrived, arrivals.sample_rows

    def _llm_samples(self, plan: IterationPlan, metadata, local):
        """Token ids to the LLM-phase workers; this worker's ``(sample, meta, payload)``."""
        disp, me = self.dispatcher, self.dispatcher.rank
        llm = plan.phase("llm")
        tokens = torch.from_numpy(np.concatenate([s.payload.tokens for s in local])).to(self.device)
        got = disp.move(
            llm.dispatch,
            tokens.view(-1, 1),
            llm.items.tokens[llm.dispatch.src_items(me)],
            label="llm tokens",
        )
        samples, start = [], 0
        for item in llm.dispatch.dst_items(me).tolist():
            s = int(llm.items.sample[item])
            meta = metadata.sample_meta(s)
            n = meta.llm_tokens
            samples.append((s, meta, SamplePayload(tokens=got[start : start + n, 0].cpu().numpy())))
            start += n
        return samples

    def _llm_microbatch(self, chosen, leaves, sample_rows):
        """One LLM microbatch of ``(sample, meta, payload)``, carrying its samples' encoder
        outputs (rows of the leaves) so that the model runs only the encoders' heads."""
        packed = build_microbatch(
            [(meta, payload) for _, meta, payload in chosen],
            list(self.mllm.encoders),
            device=self.device,
            with_features=False,
        )
        for enc in packed.encoders:
            rows = np.concatenate(
                [np.arange(*sample_rows[enc][s]) for s, _, _ in chosen if s in sample_rows[enc]]
            )
            packed.encoder_hidden[enc] = leaves[enc].index_select(
                0, torch.as_tensor(rows, device=self.device)
            )
        return packed
