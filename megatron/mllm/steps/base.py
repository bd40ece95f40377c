# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""What every training step is: megatron-core's ``forward_backward_func``, plus its report.

A step is called exactly as megatron-core 0.19's ``get_forward_backward_func()`` result is
(keyword arguments ``forward_step_func``, ``data_iterator``, ``model``, ``num_microbatches``,
``seq_length``, ``micro_batch_size``, ``forward_only``, ...), runs the forward and backward of
one global batch on this rank, and returns the loss dicts of the microbatches whose loss it
computed. Its ``data_iterator`` yields the loader's microbatches
(:class:`~megatron.mllm.data.LoadedMicrobatch`): raw samples, which each step packs, moves or
re-plans as its mode requires. Beyond the contract a step says what it is (:meth:`describe`)
and what it did in its latest call (:attr:`balance_stats`).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from megatron.mllm.arguments import ConfigError
from megatron.mllm.batch import encoder_input_dtype
from megatron.mllm.data import LoadedMicrobatch
from megatron.mllm.distributed import max_over_group
from megatron.mllm.steps.plan_ahead import PlanAhead, check_control_digests, digest_words
from megatron.mllm.timers import NULL_TIMERS, StepTimers
from orchestration.balance import InfeasibleCapError
from orchestration.cost_feedback import CostFeedback
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.measured_guard import AlternatingArms, MeasuredGuard
from orchestration.microbatches import MicrobatchPlan, fewest_llm_microbatches, form_microbatches
from orchestration.packing import pack_sequences
from orchestration.plan_job import PlanJob, PlanResult
from orchestration.plan_share import PlanShare

BALANCE_ALGORITHMS = {"lpt": "lpt+refine", "kk": "kk+refine", "auto": "auto"}
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

    predicted_loads: dict[str, list[float]] = field(default_factory=dict)
    """Per phase, every rank's load under the plan (the prediction the plan acts on)."""

    predicted_loads_before: dict[str, list[float]] = field(default_factory=dict)
    """Per phase, every rank's load had its own samples stayed (Megatron's assignment)."""

    unit: str = "flops"
    """Unit of the loads: ``flops``, or ``seconds`` with a calibrated cost model."""

    plan_source: str = "step"
    """Where the plan was made: ``step`` (critical path) or ``ahead`` (planning worker)."""

    plan_background_s: float = 0.0
    """Seconds the background thread spent on the plan (0 when made in the step)."""

    plan_digest: str = ""
    """The plan's digest (the same on every rank)."""

    decisions: str = ""
    """Per phase, balanced or kept by the exchange check, with gain and cost (empty without
    the check)."""

    balanced: bool = True
    """False: the balance guard ran this iteration as Megatron would, with its assignment and
    its step (``--post-balance-guard-interval``)."""

    as_loaded: bool = False
    """The plan kept every phase home, so Megatron's packed step ran it (``--pack-sequences``)."""

    guard_gain: float | None = None
    """The balance guard's latest measured gain of balancing over Megatron's step (None before
    its first decision, or without a guard)."""


class TrainingStep:
    """Base of the training modes (see the module docstring)."""

    padded_length: int | None = None
    """The fixed length every microbatch is padded to, or None when the step packs without
    padding (it decides what the loader's assignment would have cost)."""

    pack_limit: int | None = None
    """``--pack-sequences``: the LLM tokens the step's Megatron microbatches were packed to
    (each rank's samples first-fit decreasing), or None: the loader's microbatches."""

    timers: StepTimers = NULL_TIMERS
    """Where the step reports its time (the run's timers; see ``megatron.mllm.timers``)."""

    before_forward: Callable[[], None] | None = None
    """Called once per call on every rank, before the step's first forward and after the
    step's collectives that precede it (the balanced steps' input exchange): where
    ``--overlap-param-gather`` dispatches the parameters' all-gathers
    (``megatron.mllm.param_gather``); None: nothing."""

    def __init__(self) -> None:
        self.balance_stats: BalanceStats | None = None
        """What balancing did in the latest call; None for steps that do not balance."""
        self.last_samples: list[list] = []
        """The samples (``SampleMeta``) of each microbatch this rank's engine ran in the latest
        call, for the prediction of the step; empty for the per-phase balanced step."""
        self.last_metadata = None
        """The latest call's batch metadata of every DP rank
        (:class:`~orchestration.metadata.GatheredMetadata`) when every rank ran its own samples
        (the unbalanced step), for the prediction of every replica; else None."""

    def __call__(self, *, forward_step_func, data_iterator, model, num_microbatches: int,
                 seq_length: int | None = None, micro_batch_size: int | None = None,
                 decoder_seq_length: int | None = None, forward_only: bool = False,
                 collect_non_loss_data: bool = False, first_val_step: bool | None = None,
                 adjust_tensor_shapes_fn=None, p2p_communicator=None, pg_collection=None,
                 force_all_reduce: bool | None = False) -> list:  # fmt: skip
        """Forward and backward of one global batch (megatron-core's contract)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The step for the setup line: ``post-balance: ... | schedule: ...``."""
        raise NotImplementedError

    def forward_starts(self) -> None:
        """Call :attr:`before_forward`, if set."""
        if self.before_forward is not None:
            self.before_forward()

    @property
    def last_schedule(self):
        """The runtime's schedule of the latest call (``pipeweaver.schedule.Schedule``); None
        when megatron-core's engine ran it (its order is fixed) or nothing was pipelined."""
        return None

    @property
    def plans_ahead(self) -> bool:
        """Whether the step plans the next iteration while this one runs (its loader must then
        gather the next iteration's metadata one iteration early)."""
        return False

    def control_words(self, iteration: int) -> np.ndarray | None:
        """What the loader's metadata gather of ``iteration`` should carry for the step (the
        digest of a plan made ahead), or None; the same on every rank."""
        return None

    def close(self) -> None:
        """Release what the step holds beyond the run (a planning thread)."""

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs of the step, this rank's (empty: nothing)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    def log_note(self) -> str | None:
        """What the step adds to the log line (None: nothing)."""
        return None

    def schedule_record(self) -> dict | None:
        """Where the latest step's pipeline schedule came from (the searched dynamic
        pipeline's ``schedule_search`` metrics), else None."""
        return None


def take(data_iterator, num_microbatches: int) -> list[LoadedMicrobatch]:
    """The step's ``num_microbatches`` loaded microbatches."""
    return [next(data_iterator) for _ in range(num_microbatches)]


class PackedStep(TrainingStep):
    """An engine that runs packed microbatches: megatron-core's own, or OrchWeave's runtime.

    The step packs each loaded microbatch as its engine needs it (padded to a fixed shape for
    megatron-core's pipeline, unpadded with encoder sub-microbatches for the runtime) and hands
    them over unchanged otherwise.
    """

    def __init__(self, engine: Callable[..., list], pack: Callable[[list], Any], schedule: str,
                 padded_length: int | None = None, runtime: Any = None,
                 schedules: Any = None, pack_limit: int | None = None):  # fmt: skip
        """Args:
        engine: a ``forward_backward_func`` over packed microbatches.
        pack: ``(metadata, payload)`` pairs -> one packed microbatch.
        schedule: names the engine's order for the setup line.
        padded_length: the fixed microbatch length ``pack`` pads to, if any.
        runtime: the :class:`~pipeweaver.runtime.executor.PipelineRuntime` whose
            ``forward_backward`` is ``engine``, when the engine is OrchWeave's.
        schedules: the runtime's searched schedules
            (:class:`~megatron.mllm.steps.schedule_ahead.SearchedSchedules`), when the dynamic
            pipeline searches; it gets the next iteration's samples before each step.
        pack_limit: ``--pack-sequences``: the rank's samples of an iteration go first-fit
            decreasing into microbatches of at most this many LLM tokens (Megatron-LM's packed
            sequences) instead of the loader's microbatches; None: the loader's.
        """
        super().__init__()
        self.engine = engine
        self.pack = pack
        self.schedule = schedule
        self.padded_length = padded_length
        self.runtime = runtime
        self.schedules = schedules
        self.pack_limit = pack_limit

    def __call__(self, *, data_iterator, num_microbatches: int, seq_length: int | None = None,
                 micro_batch_size: int | None = None, **kwargs) -> list:  # fmt: skip
        loaded = take(data_iterator, num_microbatches)
        groups = self.packed([mb.pairs() for mb in loaded], lambda pair: pair[0])
        self.last_samples = [[meta for meta, _ in group] for group in groups]
        self.last_metadata = loaded[0].batch.metadata if loaded else None
        if self.schedules is not None:
            following = loaded[0].batch.next_microbatches if loaded else None
            self.schedules.prepare(self.packed(following, lambda meta: meta))
        with self.timers.span("pack"):
            microbatches = [self.pack(group) for group in groups]
        self.forward_starts()
        return self.run_packed(microbatches, seq_length=seq_length, **kwargs)

    def packed(self, microbatches: list[list] | None,
               meta_of: Callable[[Any], Any]) -> list[list] | None:  # fmt: skip
        """The loader's ``microbatches`` (of samples, or of ``(meta, payload)`` pairs: ``meta_of``
        gives a sample's metadata; None: none) as the engine runs them: as they are, or with
        ``--pack-sequences`` first-fit decreasing into sequences of :attr:`pack_limit` tokens."""
        if self.pack_limit is None or microbatches is None:
            return microbatches
        samples = [s for mb in microbatches for s in mb]
        return pack_sequences(samples, lambda s: meta_of(s).llm_tokens, self.pack_limit)

    def run_packed(self, microbatches: list, *, seq_length: int | None = None,
                   micro_batch_size: int | None = None, **kwargs) -> list:  # fmt: skip
        """Run the engine on microbatches already packed by :attr:`pack` (``micro_batch_size``
        is the loader's; a packed microbatch is one sequence)."""
        # Packed microbatches are one sequence of S tokens ([S, 1, h]): megatron-core's
        # pipeline communicates that shape, padded to a fixed S.
        return self.engine(
            data_iterator=iter(microbatches),
            num_microbatches=len(microbatches),
            seq_length=self.padded_length or seq_length,
            micro_batch_size=1,
            **kwargs,
        )

    def describe(self) -> str:
        return f"post-balance: none | schedule: {self.schedule}"

    @property
    def plans_ahead(self) -> bool:
        return self.schedules is not None and self.schedules.ahead_requested

    def log_note(self) -> str | None:
        last = self.schedules.last if self.schedules is not None else None
        return None if last is None else last.note()

    def schedule_record(self) -> dict | None:
        last = self.schedules.last if self.schedules is not None else None
        return None if last is None else last.record()

    def close(self) -> None:
        if self.schedules is not None:
            self.schedules.close()

    @property
    def last_schedule(self):
        return None if self.runtime is None else self.runtime.last_schedule


class BalancedStep(TrainingStep):
    """What the two post-balancing steps share: the planner's inputs, the dispatcher, and how
    a rank's samples become microbatches after the exchange."""

    def __init__(self, run, mllm, dispatcher: Dispatcher, cost_model: CostModel,
                 device: torch.device):  # fmt: skip
        """Args:
        run: the :class:`~megatron.mllm.run_config.RunConfig`.
        mllm: the model (``megatron.mllm.config.MLLMConfig``).
        dispatcher: collectives over this rank's DP group.
        cost_model: the planner's per-phase costs.
        device: this rank's device.
        """
        super().__init__()
        self.balance = run.balance
        self.algorithm = BALANCE_ALGORITHMS[run.balance.post_balance]
        self.packing_limit = run.packing_limit
        self.pack_sequences = run.workload.pack_sequences
        self.mllm = mllm
        self.dispatcher = dispatcher
        self.cost_model = cost_model
        self.device = device
        self.input_dtypes = {
            enc: encoder_input_dtype(enc, run.data is not None) for enc in mllm.encoders
        }
        """Per encoder, the dtype its inputs travel in (every rank's must agree)."""
        timeout_s = run.distributed_timeout.total_seconds()
        self.ahead = PlanAhead(
            run.balance.plan_ahead,
            timeout_s,
            name=f"rank {dist.get_rank()}" if dist.is_initialized() else "this rank",
            share=self._plan_share(dispatcher, timeout_s) if run.balance.plan_ahead else None,
        )
        # The digest rides on the DP group's metadata gather only when that group is the
        # whole world: with several DP groups (PP or TP > 1) all of them must agree, which
        # takes the world-wide check.
        self.fold_digest = (
            run.balance.check_plan_digest
            and run.balance.plan_ahead
            and dispatcher.world == dist.get_world_size()
        )
        self.plan_source = "step"
        """Where the latest plan was made: ``step`` or ``ahead``."""
        self.feedback: CostFeedback | None = None
        """The online fits of the costs (the per-phase step's, when on), else None."""
        self.guard: MeasuredGuard | AlternatingArms | None = None
        """Holds balancing against Megatron's step on the run's clock (the per-phase step's,
        with ``--post-balance-guard-interval``), else None: every iteration is balanced."""
        self.fallback: PackedStep | None = None
        """With a guard, the step Megatron runs (``--post-balance none``), for the iterations
        the guard keeps unbalanced."""
        self._loaded_at: tuple[int, float] | None = None  # the latest load: iteration, clock
        self._balanced_next: tuple[int, bool] | None = None  # the next iteration's mode
        self.equal_over: list = []
        """Process groups (TP, PP) whose ranks share this rank's DP index: each gathers the
        control words over its own DP group, so the words are first made equal over these
        (:meth:`control_words`), and every rank fits, plans and guards alike."""

    def describe_balance(self, mode: str) -> str:
        """``post-balance: auto, <mode>[, node-wise all-to-all (...)]`` for the setup line."""
        text = f"post-balance: {self.balance.post_balance}, {mode}"
        if self.balance.node_wise_a2a:
            text += (
                f", node-wise all-to-all ({self.dispatcher.gpus_per_node} data-parallel ranks "
                "per node)"
            )
        return text

    def describe_guard(self) -> str:
        """The guard's part of the setup line (empty without one)."""
        g = self.guard
        if isinstance(g, AlternatingArms):
            first = "balanced" if g.first_on else "Megatron's step"
            return (f", alternating with Megatron's step in blocks of {g.block} iterations "
                    f"({first} first; --post-balance-alternate)")  # fmt: skip
        if g is not None:
            return (f", its measured gain over Megatron's step probed every {g.interval} "
                    f"iterations from the {g.next_probe + 1}th")  # fmt: skip
        return ""

    def planner(self) -> tuple[Callable[..., Any], dict[str, Any], dict[str, Any]]:
        """The step's module-level planner, its keyword arguments beyond the algorithm and the
        caps, and those that replace them once the costs are fitted (see ``PlanJob``)."""
        raise NotImplementedError

    def plan_job(self, metadata, iteration: int, observation=None) -> PlanJob:
        """The plan of ``iteration``'s gathered metadata as a job (pure, no collective): made
        with the step's cost model, or with its fits after they observed ``observation``."""
        planner, kwargs, fitted = self.planner()
        kwargs = dict(kwargs, algorithm=self.algorithm, caps=self.balance.token_caps)
        return PlanJob(planner, metadata, iteration, self.cost_model, kwargs, fitted,
                       self.feedback, observation)  # fmt: skip

    def plan_for(self, metadata, iteration: int = 0) -> Any:
        """The step's plan of one iteration's metadata, made here (the simulator's and the
        tests' way to get the plan the step would make)."""
        return self._adopted(self.plan_job(metadata, iteration)())

    def _take(self, iteration: int, in_step: Callable[[], PlanResult]) -> Any:
        """``iteration``'s plan, made ahead or by ``in_step`` now, with its fits adopted; caps
        it cannot meet stop the run with the flag, the phase and the sizes.

        Raises:
            ConfigError: naming ``--post-balance-token-caps PHASE=TOKENS`` and the item or the
                total that does not fit.
        """
        caps = self.balance.token_caps
        try:
            dropped = self.ahead.drop_other(iteration)
            if dropped is not None:
                self._adopted(dropped)
            result, _ = self.ahead.take(iteration, in_step)
        except InfeasibleCapError as e:
            flag = "--post-balance-token-caps"
            if e.phase in caps:
                flag += f" {e.phase}={caps[e.phase]}"
            raise ConfigError(f"{flag}: {e}") from None
        return self._adopted(result)

    def _adopted(self, result: PlanResult) -> Any:
        """``result``'s plan, its fits now the step's."""
        if result.feedback is not None:
            self.feedback.adopt(result.feedback)
        return result.plan

    @property
    def plans_ahead(self) -> bool:
        return self.ahead.enabled

    @staticmethod
    def _plan_share(dispatcher: Dispatcher, timeout_s: float) -> PlanShare | None:
        """The DP group's shared plans on this host, named by a token the group takes from its
        first rank (one gather at start-up); None for a group of one."""
        if dispatcher.world < 2:
            return None
        mine = np.array([secrets.randbits(63)], dtype=np.int64)
        token = int(dispatcher.all_gather_arrays(mine, "plan share token all-gather")[0][0])
        # A reader that waits this long for another worker's plan makes it itself, well before
        # the step gives up on its own worker.
        return PlanShare.for_group(token, wait_s=timeout_s / 4)

    def control_words(self, iteration: int) -> np.ndarray | None:
        """This rank's control words for ``iteration``'s metadata gather, made equal over
        :attr:`equal_over`: the largest of each measured time (the ranks of one DP index ran
        the same work; the slowest is what the step waits for). All those ranks have words or
        none alike, of one length: the sections follow the plan and the iteration."""
        words = self._own_control_words(iteration)
        for group in self.equal_over if words is not None else ():
            words = max_over_group(torch.from_numpy(words).to(self.device), group).cpu().numpy()
        return words

    def _own_control_words(self, iteration: int) -> np.ndarray | None:
        digest = np.zeros(0, np.int64)
        if self.fold_digest and self.ahead.has(iteration):
            with self.timers.span("plan-wait"):
                plan = self.ahead.peek(iteration).plan
            digest = digest_words(plan.digest)
        measured = self.feedback.words() if self.feedback is not None else np.zeros(0, np.int64)
        timed = self._timed_words(iteration)
        if not digest.size and not measured.size and not timed.size:
            return None
        return np.concatenate(
            [[digest.size], digest, [measured.size], measured, [timed.size], timed]
        ).astype(np.int64)

    def _timed_words(self, iteration: int) -> np.ndarray:
        """With a guard, the previous iteration's wall time on this rank, from its load to this
        one (the step, the optimizer, everything): ``[iteration - 1, nanoseconds]``, riding on
        this gather so that every rank's guard sees every rank's time."""
        now = time.perf_counter()
        previous, self._loaded_at = self._loaded_at, (iteration, now)
        if self.guard is None or previous is None or previous[0] != iteration - 1:
            return np.zeros(0, np.int64)
        return np.array([iteration - 1, round((now - previous[1]) * 1e9)], np.int64)

    def balances(self, iteration: int) -> bool:
        """Whether ``iteration`` is balanced: always without a guard, else as the guard said
        when the iteration before it was stepped (its plan was made ahead then, or not)."""
        if self.guard is None:
            return True
        if self._balanced_next is not None and self._balanced_next[0] == iteration:
            return self._balanced_next[1]
        return self.guard.enabled(iteration)

    def planned(self, batch) -> Any:
        """This iteration's plan, checked across ranks; the next iteration's goes to the
        background thread before this one runs.

        The plan made ahead is taken (its wait timed as ``plan-wait``), or made now (``plan``).
        Its digest is compared in the control words of this iteration's metadata gather when
        they carry it, else with a collective of its own (unless told not to check). Then the
        measured times of the previous iteration, which rode on the same gather, are fed to
        the fits, and the next plan starts with what they learnt.
        """
        ahead = self.ahead.has(batch.iteration)
        with self.timers.span("plan-wait" if ahead else "plan"):
            plan = self._take(
                batch.iteration, lambda: self.plan_job(batch.metadata, batch.iteration)()
            )
        self.plan_source = "ahead" if ahead else "step"
        digests, measured, timed = _split_control(batch.control)
        if digests is not None:
            check_control_digests(digests)
        elif self.balance.check_plan_digest:
            self.dispatcher.check_digest(plan.digest)
        self._advance(batch, measured, timed, balanced=True)
        return plan

    def unbalanced(self, batch) -> None:
        """An iteration the guard runs as Megatron would: nothing planned, nothing moved; the
        times gathered with its batch still go to the fits and to the guard."""
        _, measured, timed = _split_control(batch.control)
        self._advance(batch, measured, timed, balanced=False)

    def _advance(self, batch, measured, timed, balanced: bool) -> None:
        """Feed the gathered times to the fits and the guard, fix the next iteration's mode,
        and start its plan in the background where both iterations are balanced (a plan made
        during an unbalanced iteration would charge it the planning, which the guard weighs:
        the first iteration of a balanced block plans in its step)."""
        self.dispatcher.reset_counters()
        observation = None
        if measured is not None and self.feedback is not None:
            observation = (self.feedback.take_pending(), measured)
        following, nxt = batch.next_metadata, batch.iteration + 1
        self._record_time(timed)
        next_balanced = self.balances(nxt)
        self._balanced_next = (nxt, next_balanced)
        if following is not None and self.ahead.enabled and balanced and next_balanced:
            # The fits learn in the worker too (a refit costs milliseconds): the job observes,
            # then plans, and the step adopts the fits that come back with the plan, so they
            # see the same values in the same order as in the step.
            self.ahead.submit(nxt, self.plan_job(following, nxt, observation))
        elif observation is not None:
            self.feedback.observe(*observation)

    def _record_time(self, timed: list[np.ndarray] | None) -> None:
        """The guard's record of the previous iteration: the slowest rank's time (every rank
        gets the same gathered values, so all decide alike). Not divided by a prediction of the
        batch's work: on a host whose step is mostly per-call overhead the model's FLOPs follow
        the time poorly (0.8 to 3.2 GFLOPs for 175 to 340 ms on the CPU main job), and both arms
        draw their batches from the same stream, whose spread the medians absorb."""
        if self.guard is None or timed is None:
            return
        iterations = {int(t[0]) for t in timed}
        if len(iterations) != 1:
            raise ValueError(f"iteration times of iterations {sorted(iterations)} gathered")
        self.guard.record(iterations.pop(), max(int(t[1]) for t in timed) / 1e9, 1.0)

    def guard_note(self) -> str:
        """The guard's state for the log line (empty without a guard)."""
        g = self.guard
        if g is None:
            return ""
        if isinstance(g, AlternatingArms):
            return f"post-balance alternating in blocks of {g.block} (--post-balance-alternate)"
        if g.gain is None:
            return f"post-balance guard: probing from iteration {g.next_probe + 1}"
        verdict = "on" if g.on else "off"
        return (
            f"post-balance guard: balancing measured {g.gain:.3f}x Megatron's step, {verdict} "
            f"until the probe at iteration {g.next_probe + 1}"
        )

    def state_dict(self) -> dict[str, Any]:
        """What a resume needs to plan as the uninterrupted run would (this rank's); waits for
        the job in flight, whose fits observed the latest times (its plan stays to be taken)."""
        state: dict[str, Any] = {}
        if self.feedback is not None:
            made = self.ahead.made()
            if made is not None:
                self._adopted(made)
            state["feedback"] = self.feedback.state_dict()
        if self.guard is not None:
            state["guard"] = self.guard.state_dict()
            state["balanced_next"] = self._balanced_next
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a state without a fit or a guard leaves it as it is)."""
        if self.feedback is not None and "feedback" in state:
            self.feedback.load_state_dict(state["feedback"])
        if self.guard is not None and "guard" in state:
            self.guard.load_state_dict(state["guard"])
            self._balanced_next = state["balanced_next"]

    def close(self) -> None:
        self.ahead.close()

    def form_microbatches(self, costs: np.ndarray, tokens: np.ndarray, num_microbatches: int,
                          samples, sample_ids) -> MicrobatchPlan:  # fmt: skip
        """This rank's ``(sample, meta, payload)`` list cut into microbatches balanced in cost
        within the packing limit: at least the step's ``num_microbatches``, or with
        ``--pack-sequences`` as few as the limit allows (``fewest_llm_microbatches``); errors
        name the sample."""
        fewest = fewest_llm_microbatches(num_microbatches, self.pack_sequences)
        labels = [f"sample {sample_ids[s]!r}" for s, _, _ in samples]
        return form_microbatches(costs, tokens, fewest, self.packing_limit, labels=labels)


def _split_control(control: list[np.ndarray] | None):
    """Every rank's control words -> per section (the digest words, the measured phase times,
    the iteration time), its words per rank, or None where rank 0's is empty; the layout is
    :meth:`BalancedStep.control_words`'s: each section its length, then its words."""
    sections: list[list[np.ndarray]] = [[], [], []]
    if control is None:
        return None, None, None
    for words in control:
        at = 0
        for section in sections:
            n = int(words[at])
            section.append(words[at + 1 : at + 1 + n])
            at += 1 + n
    return tuple(s if s[0].size else None for s in sections)
