# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""OrchMLLM's per-phase batch post-balancing as a training step (PP = 1).

After each DP rank has loaded its samples (Megatron's order), every phase (each encoder, then
the LLM) gets its own plan over the all-gathered metadata (``orchestration.phase_plan``), and
the dispatcher moves the work in three all-to-alls per iteration, whatever the number of
encoders (each collective costs a latency on every rank, however little it carries):

1. **inputs and tokens**: every encoder's inputs (pixels, frame features) go from the loader to
   its encoder-phase worker, and the token ids to the LLM-phase worker, in one packed buffer;
2. each worker runs every encoder body on its units, packed, once per iteration;
3. **encoder outputs**: every encoder's unit outputs travel together, straight to the LLM-phase
   worker of their sample, which pools and projects each item (the head needs whole items);
   the LLM worker forms balanced microbatches within the packing limit and runs forward and
   backward on each with megatron-core's ``forward_step``/``backward_step`` (so the loss and
   gradient-scaling contract is Megatron's);
4. **encoder outputs backward**: the gradients of all unit outputs return in one transposed
   all-to-all, and each encoder's backward runs on its worker; finally megatron-core's
   ``finalize_model_grads``.

Hops 3 and 4 run beside the LLM microbatches whose samples need no other rank's encoder
outputs (``encoder_outputs``: the rows computed for this rank's own samples never travel).
Every rank joins every collective, even with no units of a modality; an exchange in which every
plan kept its rows at home is skipped by all ranks alike. Encoder outputs of all microbatches
are held as leaf tensors per encoder (the rows kept home, the rows from other ranks), so the
backward exchange runs once per iteration, not once per microbatch (ranks may have different
numbers of microbatches). Moving work never changes what is learned: the loss is normalised by
the global number of loss tokens.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch
import torch.distributed as dist

from megatron.core.pipeline_parallel.schedules import backward_step, forward_step
from megatron.core.utils import get_attr_wrapped_model, get_model_config
from megatron.mllm.batch import (
    ChatTurns,
    SamplePayload,
    build_microbatch,
    encoder_features,
    encoder_input_dtype,
    thd_params,
)
from megatron.mllm.config import MLLMConfig
from megatron.mllm.steps.base import BalancedStep, BalanceStats, PackedStep, take
from megatron.mllm.steps.encoder_outputs import EncoderOutputs
from orchestration.balance import DEFAULT_BUDGET
from orchestration.cost_feedback import FITTED_BUDGET, CostFeedback, Measured
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.exchange_cost import PayloadBytes
from orchestration.measured_guard import AlternatingArms, MeasuredGuard
from orchestration.microbatches import MicrobatchPlan, fewest_llm_microbatches, overlap_order
from orchestration.phase_plan import IterationPlan, plan_iteration


def payload_bytes(mllm: MLLMConfig, real_data: bool) -> PayloadBytes:
    """Bytes per row of the step's routes: encoder inputs as the loader makes them (float32
    features; uint8 pixels for real images, ``real_data``: ``--data-path``), int64 token ids,
    encoder outputs in the parameters' dtype."""
    element = torch.empty(0, dtype=mllm.language.params_dtype).element_size()
    inputs = {
        name: float(enc.input_dim * encoder_input_dtype(name, real_data).itemsize)
        for name, enc in mllm.encoders.items()
    }
    inputs["llm"] = 8.0
    outputs = {name: float(enc.hidden_size * element) for name, enc in mllm.encoders.items()}
    return PayloadBytes(inputs=inputs, outputs=outputs)


class PhaseClock:
    """Wall-clock seconds of host-visible work; on CUDA it waits for the device first, so a
    phase's time is its kernels' and not their launch's."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class PhaseBalancedStep(BalancedStep):
    """Per-phase post-balancing with PP = 1 (see the module docstring)."""

    def __init__(self, run, mllm: MLLMConfig, dispatcher: Dispatcher, cost_model: CostModel,
                 pg_collection, device: torch.device, chat_turns: ChatTurns | None = None,
                 fallback: PackedStep | None = None):  # fmt: skip
        """Args: those of :class:`BalancedStep`, ``pg_collection``, megatron-core's process
        groups (for ``finalize_model_grads``), ``chat_turns``, the turn tokens the LLM
        microbatches mask the loss by (``--prompt-format chat``; None: no masking), and
        ``fallback``, Megatron's own step (``--post-balance none``): with it and
        ``--post-balance-guard-interval`` > 0, the guard measures balancing against it in the
        run and runs it where balancing does not pay; packed, it also runs the iterations
        whose plan keeps every phase home (:meth:`runs_as_loaded`)."""
        super().__init__(run, mllm, dispatcher, cost_model, device)
        self.pg_collection = pg_collection
        self.chat_turns = chat_turns
        self.clock = PhaseClock(device)
        self.phase_s: dict[str, float] = {}
        """This rank's compute seconds per phase in the latest call."""
        self.num_microbatches = 0
        """The step's microbatch count (of the latest call): the LLM phase leaves every rank at
        least as many samples, so that all run as many microbatches (0 before the first)."""
        b = run.balance
        tp = getattr(pg_collection, "tp", None)
        if tp is not None and dist.get_world_size(tp) > 1:
            self.equal_over = [tp]
        # The fits and the guard need every rank's times on every rank, alike: the times ride on
        # the DP group's metadata gather, and with TP > 1 (each TP rank gathering over its own
        # DP group) they are first made equal across each TP group, so that every DP group
        # gathers the same values and every rank makes the same plans.
        shared = b.cost_fit or fallback is not None
        if shared:
            tp_size = dist.get_world_size(tp) if self.equal_over else 1
            shared = dispatcher.world * tp_size == dist.get_world_size()
        if b.cost_fit and shared:
            self.feedback = CostFeedback.starting(
                cost_model, payload_bytes(mllm, run.data is not None), b.cost_fit_window,
                b.cost_fit_warmup,
            )  # fmt: skip
        if fallback is not None and shared:
            if b.post_balance_alternate:
                first = b.post_balance_alternate_first == "balanced"
                self.guard = AlternatingArms(b.post_balance_alternate, first_on=first)
            elif b.post_balance_guard_interval:
                self.guard = MeasuredGuard(b.post_balance_guard_interval)
        self.fallback = fallback

    def describe(self) -> str:
        text = self.describe_balance(f"per phase {self.balance.balance_phases}")
        if self.feedback is not None:
            text += (f", costs fitted to measured times after {self.balance.cost_fit_warmup} "
                     "iterations")  # fmt: skip
        if self.ahead.enabled:
            text += ", planned ahead"
        text += self.describe_guard()
        return text + " | schedule: orchestrated two-hop (encoders, then LLM microbatches)"

    def planner(self):
        """``plan_iteration`` over the balanced phases; a phase whose predicted gain does not pay
        for its exchanges (once the fits give seconds) keeps the loader's assignment."""
        b = self.balance
        fewest = fewest_llm_microbatches(self.num_microbatches, self.pack_sequences)
        kwargs = dict(phases=b.balance_phases, gpus_per_node=self.dispatcher.gpus_per_node,
                      budget=DEFAULT_BUDGET, min_llm_samples=fewest)  # fmt: skip
        return plan_iteration, kwargs, {"budget": FITTED_BUDGET}

    def log_note(self) -> str | None:
        """The fitted coefficients and the latest plan's decisions, for the log line."""
        parts = []
        if self.feedback is not None:
            parts.append(self.feedback.describe())
            decisions = self.balance_stats.decisions if self.balance_stats else ""
            if decisions:
                parts.append(f"decisions: {decisions}")
        if self.guard is not None:
            parts.append(self.guard_note())
        return " | ".join(parts) or None

    def __call__(self, *, data_iterator, num_microbatches: int, **kwargs) -> list:
        loaded = take(data_iterator, num_microbatches)
        batch = loaded[0].batch
        self.num_microbatches = num_microbatches
        if not self.balances(batch.iteration):
            self.unbalanced(batch)
            gain = self.guard.gain
            self.balance_stats = BalanceStats(plan_source="guard", balanced=False, guard_gain=gain)
            return self._as_loaded(loaded, num_microbatches, **kwargs)
        plan = self.planned(batch)
        stats = BalanceStats(
            plan_source=self.plan_source,
            plan_background_s=self.ahead.background_s,
            decisions=plan.describe_decisions(),
            plan_digest=plan.digest,
            guard_gain=self.guard.gain if self.guard is not None else None,
        )
        for p in plan.phases:
            stats.imbalance_before[p.phase] = p.imbalance_before
            stats.imbalance_after[p.phase] = p.imbalance_after
            stats.moved_fraction[p.phase] = p.moved_fraction
            stats.predicted_loads[p.phase] = [float(x) for x in p.loads_after]
            stats.predicted_loads_before[p.phase] = [float(x) for x in p.loads_before]
            stats.unit = p.unit
        if self.runs_as_loaded(plan):
            stats.as_loaded = True
            losses = self._as_loaded(loaded, num_microbatches, **kwargs)
            stats.num_microbatches = len(self.last_samples)
            self.balance_stats = stats
            return losses
        self.last_samples = []
        return self._balanced(loaded, plan, stats, num_microbatches, **kwargs)

    def runs_as_loaded(self, plan: IterationPlan) -> bool:
        """Whether a balanced iteration runs Megatron's own step: with ``--pack-sequences``,
        when the plan keeps every phase where it was loaded. Nothing moves then, and Megatron's
        packed step runs each encoder over a rank's units in as few calls as this step would,
        without this step's host work (the exchanges' layouts, the encoder outputs' routing,
        each phase timed apart: 4.4 ms of a 45 ms iteration on speech, 2026-12-08). Its phase
        times are not measured apart, so the fits observe nothing of such an iteration. Unpacked,
        this step still runs each encoder once over all of a rank's units where Megatron's runs
        it once per microbatch, so it keeps running itself."""
        return (self.pack_sequences and self.fallback is not None
                and all(p.dispatch.moves_nothing for p in plan.phases))  # fmt: skip

    def _as_loaded(self, loaded, num_microbatches: int, **kwargs) -> list:
        """Megatron's own step on the loader's samples, as ``--post-balance none`` runs them."""
        self.forward_starts()  # Megatron's step has no collective before its forward
        losses = self.fallback(data_iterator=iter(loaded), num_microbatches=num_microbatches,
                               **kwargs)  # fmt: skip
        self.last_samples = self.fallback.last_samples
        return losses

    def _balanced(self, loaded, plan: IterationPlan, stats: BalanceStats, num_microbatches: int,
                  *, forward_step_func, model, forward_only: bool = False,
                  collect_non_loss_data: bool = False, **unused) -> list:  # fmt: skip
        batch = loaded[0].batch
        local = [s for mb in loaded for s in mb.samples]
        disp = self.dispatcher
        me = disp.rank
        self.phase_s = dict.fromkeys(self.cost_model.phase_order, 0.0)
        config = get_model_config(model[0])
        encoders = get_attr_wrapped_model(model[0], "encoders")
        no_sync = config.no_sync_func if config.no_sync_func is not None else contextlib.nullcontext
        grad = contextlib.nullcontext() if not forward_only else torch.no_grad()
        losses: list = []
        # As in Megatron's step, the last LLM microbatch (and here the encoders' backward after
        # it) runs outside no_sync, so that with --overlap-grad-reduce each gradient is final
        # at its hook (megatron.mllm.grad_overlap); until then DDP only accumulates.
        syncing = contextlib.ExitStack()
        syncing.enter_context(no_sync())
        with syncing, grad:
            inputs, samples = self._exchange_inputs(plan, batch.metadata, local)
            self.forward_starts()
            outputs = self._encoder_phases(plan, encoders, inputs, forward_only)
            with self.timers.span("microbatches"):
                mb_plan = self.llm_microbatches(plan, samples, batch.metadata.sample_ids)
            stats.num_microbatches = mb_plan.num_microbatches
            chosen = [[samples[j] for j in mb] for mb in mb_plan.microbatches]
            home = plan.home_samples(me)
            groups = overlap_order([all(s in home for s, _, _ in c) for c in chosen],
                                   self.balance.overlap_exchanges)  # fmt: skip
            total_tokens = torch.zeros([], dtype=torch.int, device=self.device)
            start, blocked, back, i = self.clock.now(), 0.0, None, 0
            with self.timers.span("llm-microbatches"):
                for g, group in enumerate(groups):
                    if g == 1:  # the rest needs other ranks' rows (or nothing is left)
                        blocked += outputs.arrive(requires_grad=not forward_only)
                    if g == 2 and not forward_only:  # no remote row gets more gradient
                        back = outputs.start_gradients()
                    for k in group:
                        if i == len(chosen) - 1:
                            syncing.close()
                        # Built one at a time: each holds a copy of its samples' encoder rows.
                        packed = self._llm_microbatch(chosen[k], outputs)
                        output, num_tokens = forward_step(
                            forward_step_func, iter([packed]), model[0],
                            mb_plan.num_microbatches, None, losses, config, 1,
                            collect_non_loss_data=collect_non_loss_data,
                            is_first_microbatch=i == 0, current_microbatch=i, is_last_stage=True,
                        )  # fmt: skip
                        total_tokens += num_tokens
                        if not forward_only:
                            backward_step(None, output, None, config)
                        i += 1
            self.phase_s["llm"] += self.clock.now() - start - blocked
            if not forward_only:
                # With --overlap-grad-reduce (megatron.mllm.grad_overlap) what the last LLM
                # microbatch did not reach is final now too (a head without items in it), and
                # the LLM's and the heads' buckets reduce during the encoders' backward.
                sync, bodies = config.grad_sync_func, {}
                if sync is not None:
                    bodies = {enc: _body_params(encoders[enc]) for enc in self.mllm.encoders}
                    held = {p for ps in bodies.values() for p in ps}
                    sync(p for p in model[0].parameters() if p not in held)
                self._encoder_backward(outputs, back, bodies, sync)
        if not forward_only and self.feedback is not None:
            self.feedback.pending = Measured(
                batch.iteration,
                dict(self.phase_s),
                {label: seconds for label, _, seconds in disp.exchanges},
                {p.phase: self.feedback.features(p) for p in plan.phases},
                {label: nbytes for label, nbytes, _ in disp.exchanges},
            )
        if not forward_only and config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func(
                model,
                total_tokens if config.calculate_per_token_loss else None,
                pg_collection=self.pg_collection,
            )
        stats.bytes_moved = disp.bytes_moved
        self.balance_stats = stats
        return losses

    def llm_microbatches(self, plan: IterationPlan, samples, sample_ids) -> MicrobatchPlan:
        """This LLM worker's ``(sample, meta, payload)`` list (the plan's destination order)
        cut into microbatches (:meth:`form_microbatches`)."""
        llm = plan.phase("llm")
        mine = llm.dispatch.dst_items(self.dispatcher.rank)
        return self.form_microbatches(
            llm.costs[mine], llm.items.tokens[mine], self.num_microbatches, samples, sample_ids
        )

    def _exchange_inputs(self, plan: IterationPlan, metadata, local):
        """The first hop, one all-to-all: every encoder's inputs to its encoder-phase workers
        and the token ids to the LLM-phase workers, together.

        Returns:
            Per encoder, the input rows that arrived here (in this worker's destination order),
            and this LLM worker's ``(sample, meta, payload)`` list.
        """
        disp, me, device = self.dispatcher, self.dispatcher.rank, self.device
        parts, names = [], []
        for enc in self.mllm.encoders:
            phase = plan.phase(enc)
            units = [u for s in local for u in s.payload.units.get(enc, [])]
            dim = self.mllm.encoders[enc].input_dim
            feats = (
                torch.from_numpy(np.concatenate(units)).to(device)
                if units
                else torch.zeros(0, dim, dtype=self.input_dtypes[enc], device=device)
            )
            sizes = phase.items.tokens[phase.dispatch.src_items(me)]
            parts.append(
                (disp.send_rows(phase.dispatch, feats, sizes), phase.dispatch.rows_matrix())
            )
            names.append(enc)
        llm = plan.phase("llm")
        tokens = torch.from_numpy(np.concatenate([s.payload.tokens for s in local])).to(device)
        sizes = llm.items.tokens[llm.dispatch.src_items(me)]
        parts.append((disp.send_rows(llm.dispatch, tokens, sizes), llm.dispatch.rows_matrix()))
        got = disp.exchange_many(parts, label="inputs and tokens")
        samples, start = [], 0
        arrived_tokens = got[-1].cpu().numpy()
        for item in llm.dispatch.dst_items(me).tolist():
            s = int(llm.items.sample[item])
            meta = metadata.sample_meta(s)
            n = meta.llm_tokens
            samples.append((s, meta, SamplePayload(tokens=arrived_tokens[start : start + n])))
            start += n
        return dict(zip(names, got[:-1])), samples

    def _encoder_phases(self, plan: IterationPlan, encoders, inputs,
                        forward_only: bool) -> EncoderOutputs:  # fmt: skip
        """Every encoder body on this worker's units, then the second hop started: every
        encoder's unit outputs to the LLM-phase worker of their sample, one all-to-all that
        runs while the LLM microbatches that need none of it do (``encoder_outputs``)."""
        me, device = self.dispatcher.rank, self.device
        hidden, lens = {}, {}
        for enc in self.mllm.encoders:
            phase = plan.phase(enc)
            lens[enc] = phase.items.tokens[phase.dispatch.dst_items(me)].astype(np.int64)
            if lens[enc].size:
                got = encoder_features(inputs[enc])  # pixels are normalised after they moved
                positions = torch.cat([torch.arange(int(n), device=device) for n in lens[enc]])
                start = self.clock.now()
                with self.timers.span("encoder-forward", detail=enc):
                    hidden[enc] = (
                        encoders[enc]
                        .body(None, got, positions, thd_params(lens[enc].tolist(), device))
                        .squeeze(1)
                    )
                self.phase_s[enc] += self.clock.now() - start
            else:
                config = encoders[enc].config
                hidden[enc] = torch.zeros(0, config.hidden_size, device=device,
                                          dtype=config.params_dtype)  # fmt: skip
        return EncoderOutputs.start(self.dispatcher, plan, hidden, lens, not forward_only)

    def _encoder_backward(self, outputs: EncoderOutputs, back, bodies, sync) -> None:
        """Each encoder's backward where its forward ran, once the gradients of its unit
        outputs are back (``back``: their exchange, started by the LLM loop); then its body's
        gradients are final (``sync``: ``config.grad_sync_func``, or None). The encoders go
        in reverse order, as a backward does: megatron-core's buckets hold the parameters in
        reverse model order, so each encoder's buckets are next in line when it is done."""
        grads = outputs.gradients(back)
        for enc, g in reversed(list(grads.items())):
            sent = outputs.sent[enc]
            if sent.requires_grad:
                start = self.clock.now()
                with self.timers.span("encoder-backward", detail=enc):
                    torch.autograd.backward(sent, g)
                self.phase_s[enc] += self.clock.now() - start
            if sync is not None:
                sync(bodies[enc])

    def _llm_microbatch(self, chosen, outputs: EncoderOutputs):
        """One LLM microbatch of ``(sample, meta, payload)``, carrying its samples' encoder
        outputs (rows of the encoder outputs' leaves) so that the model runs only the encoders'
        heads."""
        packed = build_microbatch(
            [(meta, payload) for _, meta, payload in chosen],
            list(self.mllm.encoders),
            device=self.device,
            with_features=False,
            chat_turns=self.chat_turns,
        )
        for enc in packed.encoders:
            packed.encoder_hidden[enc] = outputs.rows(enc, [s for s, _, _ in chosen])
        return packed


def _body_params(encoder) -> list:
    """An encoder's parameters but its head's (the projector, which runs in the LLM
    microbatches): those that only its backward in the encoder phase gives gradients."""
    return [p for name, p in encoder.named_parameters() if not name.startswith("projector.")]
