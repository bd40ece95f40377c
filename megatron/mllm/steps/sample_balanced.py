# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Whole-sample batch post-balancing as a training step (PP > 1).

With pipeline parallelism each DP group runs its own pipeline, so the balancer sits ahead of
the groups: whole samples (token ids and, on stages that run an encoder's input layer, their
features) move between DP groups to balance the predicted cost of each group's batch
(``orchestration.sample_plan``); inside the group the microbatches are formed by cost within
the packing limit, then the group's engine (megatron-core's pipeline or OrchWeave's runtime)
runs them. Every pipeline stage moves what it needs within its own DP group.
"""

from __future__ import annotations

import numpy as np
import torch

from megatron.mllm import distributed
from megatron.mllm.arguments import ConfigError
from megatron.mllm.batch import SamplePayload
from megatron.mllm.config import MLLMConfig
from megatron.mllm.steps.base import BalancedStep, BalanceStats, PackedStep, take
from orchestration.balance import max_over_mean
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.measured_guard import AlternatingArms, taking_turns
from orchestration.metadata import sample_encoder_tokens
from orchestration.sample_plan import plan_whole_samples


class SampleBalancedStep(BalancedStep):
    """Whole samples re-assigned across DP groups, then the group's engine."""

    def __init__(self, engine: PackedStep, run, mllm: MLLMConfig, dispatcher: Dispatcher,
                 cost_model: CostModel, pp_group, with_features: bool,
                 device: torch.device, tp_group=None):  # fmt: skip
        """Args: those of :class:`BalancedStep` (``dispatcher`` over this stage's DP group), and

        engine: the group's pipeline, with its packing.
        pp_group: this rank's pipeline group (to add up what every stage moved).
        with_features: this stage runs an encoder's input layer, so features move too.
        tp_group: this rank's tensor-parallel group (None: TP = 1).

        With ``--post-balance-guard-interval`` the guard measures balancing against the engine
        on the loader's samples (Megatron's assignment) in the run and keeps the faster; with
        ``--post-balance-alternate K`` the step alternates blocks of K iterations of the two
        instead. The iteration times ride on each stage's DP gather, made equal over the
        pipeline (and TP) group first, so every rank switches alike. The dynamic pipeline's
        search has a guard of its own: the two probe in turns.

        Raises:
            ConfigError: the two guards cannot take turns (naming both flags).
        """
        super().__init__(run, mllm, dispatcher, cost_model, device)
        self.engine = engine
        self.padded_length = engine.padded_length
        self.pp_group = pp_group
        self.with_features = with_features
        self.equal_over = [g for g in (pp_group, tp_group)
                           if g is not None and distributed.group_size(g) > 1]  # fmt: skip
        b = run.balance
        if b.post_balance_alternate:
            first = b.post_balance_alternate_first == "balanced"
            self.guard = AlternatingArms(b.post_balance_alternate, first_on=first)
        elif b.post_balance_guard_interval:
            search = getattr(getattr(engine, "schedules", None), "guard", None)
            flag = ("--schedule-search-alternate" if isinstance(search, AlternatingArms)
                    else "--schedule-search-guard-interval")  # fmt: skip
            try:
                self.guard = taking_turns(b.post_balance_guard_interval, search,
                                          "--post-balance-guard-interval", flag)  # fmt: skip
            except ValueError as e:
                raise ConfigError(str(e)) from None

    def describe(self) -> str:
        text = self.describe_balance("whole samples across DP groups") + self.describe_guard()
        return f"{text} | schedule: {self.engine.schedule}"

    @property
    def last_schedule(self):
        return self.engine.last_schedule

    def log_note(self) -> str | None:
        return " | ".join(p for p in (self.engine.log_note(), self.guard_note()) if p) or None

    def schedule_record(self) -> dict | None:
        return self.engine.schedule_record()

    def close(self) -> None:
        super().close()
        self.engine.close()

    def planner(self):
        """The whole-sample plan across DP groups (no exchange check: a group's samples move as
        a whole, once)."""
        return plan_whole_samples, {}, {}

    def __call__(self, *, data_iterator, num_microbatches: int, **kwargs) -> list:
        loaded = take(data_iterator, num_microbatches)
        if not self.balances(loaded[0].batch.iteration):
            return self._unbalanced(loaded, **kwargs)
        metadata = loaded[0].batch.metadata
        local = [s for mb in loaded for s in mb.samples]
        disp, me = self.dispatcher, self.dispatcher.rank
        plan = self.planned(loaded[0].batch)
        self._search_next(loaded[0].batch, num_microbatches)
        route = plan.dispatch
        # Token ids (every stage builds its labels and shapes from them) and, on the stages
        # that run an encoder's input layer, its features: one all-to-all for all.
        tokens = torch.from_numpy(np.concatenate([s.payload.tokens for s in local]))
        parts = [(disp.send_rows(route, tokens, route.rows[route.src_items(me)]),
                  route.rows_matrix())]  # fmt: skip
        encoders = list(self.mllm.encoders.items()) if self.with_features else []
        for enc, spec in encoders:
            # Feature rows of every sample: its encoder tokens of this encoder.
            rows = sample_encoder_tokens(metadata, enc)
            units = [u for s in local for u in s.payload.units.get(enc, [])]
            sent = (
                torch.from_numpy(np.concatenate(units))
                if units
                else torch.zeros(0, spec.input_dim, dtype=self.input_dtypes[enc])
            )
            by_rows = route.with_rows(rows)
            parts.append((disp.send_rows(by_rows, sent, rows[route.src_items(me)]),
                          by_rows.rows_matrix()))  # fmt: skip
        got = disp.exchange_many(parts, label="sample tokens and features")
        got_tokens = got[0].numpy()
        feats = {enc: g.numpy() for (enc, _), g in zip(encoders, got[1:])}
        mine = route.dst_items(me)
        samples = self._samples(plan, metadata, mine, got_tokens, feats)
        with self.timers.span("microbatches"):
            mb_plan = self.form_microbatches(
                plan.costs[mine], plan.items.tokens[mine], num_microbatches, samples,
                metadata.sample_ids,
            )  # fmt: skip
            microbatches = [
                self.engine.pack([(samples[i][1], samples[i][2]) for i in mb])
                for mb in mb_plan.microbatches
            ]
        self.last_samples = [[samples[i][1] for i in mb] for mb in mb_plan.microbatches]
        stats = BalanceStats(
            imbalance_before={"groups": plan.imbalance_before},
            imbalance_after={"groups": plan.imbalance_after},
            moved_fraction={"samples": route.moved_items / max(1, route.size)},
            num_microbatches=len(microbatches),
            plan_source=self.plan_source,
            plan_background_s=self.ahead.background_s,
            guard_gain=self.guard.gain if self.guard is not None else None,
        )
        for phase in plan.phase_costs:
            stats.imbalance_before[phase] = max_over_mean(plan.phase_loads(phase, after=False))
            stats.imbalance_after[phase] = max_over_mean(plan.phase_loads(phase, after=True))
        # Each pipeline stage moved what it needs within its own DP group: add them up.
        moved = torch.tensor([disp.bytes_moved], dtype=torch.float64, device=self.device)
        stats.bytes_moved = int(distributed.sum_over_group(moved, self.pp_group).item())
        self.balance_stats = stats
        self.forward_starts()
        return self.engine.run_packed(microbatches, **kwargs)

    def _unbalanced(self, loaded, **kwargs) -> list:
        """An iteration the guard (or the alternation) runs as Megatron would: the engine on
        the loader's samples, nothing planned or moved; its times still reach the guard."""
        batch = loaded[0].batch
        self.unbalanced(batch)
        self.balance_stats = BalanceStats(plan_source="guard", balanced=False,
                                          guard_gain=self.guard.gain)  # fmt: skip
        groups = self.engine.packed([mb.pairs() for mb in loaded], lambda pair: pair[0])
        self.last_samples = [[meta for meta, _ in group] for group in groups]
        self._search_next(batch, len(loaded))
        with self.timers.span("pack"):
            microbatches = [self.engine.pack(group) for group in groups]
        self.forward_starts()
        return self.engine.run_packed(microbatches, **kwargs)

    def _search_next(self, batch, num_microbatches: int) -> None:
        """Hand the engine's searched schedules (if any) the next iteration's microbatches: the
        loader's when the next iteration runs unbalanced; else a function of the next plan,
        made in the planning thread, so the search waits for it (none when that plan is made in
        the next step: the next schedule is searched there)."""
        schedules = self.engine.schedules
        if schedules is None:
            return
        if self._balanced_next == (batch.iteration + 1, False):
            schedules.prepare(self.engine.packed(batch.next_microbatches, lambda meta: meta))
            return
        waiter = self.ahead.waiter(batch.iteration + 1)
        if waiter is None or batch.next_metadata is None:
            schedules.prepare(None)
            return
        metadata = batch.next_metadata
        # The waiter gives the planning worker's result: the plan, with the fits it made
        # (adopted when the next step takes it).
        schedules.prepare(
            lambda: self.group_microbatches(waiter().plan, metadata, num_microbatches)
        )

    def group_microbatches(self, plan, metadata, num_microbatches: int) -> list[list]:
        """This group's samples (``SampleMeta``) of a plan, per microbatch, exactly as the step
        forms them after the exchange; pure, no collective."""
        mine = plan.dispatch.dst_items(self.dispatcher.rank)
        samples = []
        for item in mine.tolist():
            s = int(plan.items.sample[item])
            samples.append((s, metadata.sample_meta(s), None))
        mb_plan = self.form_microbatches(
            plan.costs[mine], plan.items.tokens[mine], num_microbatches, samples,
            metadata.sample_ids,
        )  # fmt: skip
        return [[samples[i][1] for i in mb] for mb in mb_plan.microbatches]

    def _samples(self, plan, metadata, mine, got_tokens, feats):
        """This group's ``(sample, meta, payload)``, in destination order."""
        samples, t0 = [], 0
        f0 = {e: 0 for e in self.mllm.encoders}
        for item in mine.tolist():
            s = int(plan.items.sample[item])
            meta = metadata.sample_meta(s)
            n = meta.llm_tokens
            payload = SamplePayload(tokens=got_tokens[t0 : t0 + n])
            t0 += n
            if self.with_features:
                for enc in self.mllm.encoders:
                    parts = []
                    for u in meta.encoder_units(enc):
                        parts.append(feats[enc][f0[enc] : f0[enc] + u])
                        f0[enc] += u
                    if parts:
                        payload.units[enc] = parts
            samples.append((s, meta, payload))
        return samples
