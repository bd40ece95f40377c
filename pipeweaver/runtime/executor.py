# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The pipeline runtime: executes a per-batch schedule and is a drop-in for Megatron's schedules.

:class:`PipelineRuntime.forward_backward` has megatron-core 0.19's ``forward_backward_func`` keyword
signature and contract: it calls the user's ``forward_step_func`` through megatron-core's
``forward_step``/``backward_step`` helpers (so loss normalisation, per-token loss, grad scaling and
``set_input_tensor`` are Megatron's), runs inside ``config.no_sync_func``, calls
``config.finalize_model_grads_func`` with the token count, and returns the loss dicts on the rank
that holds the last LLM chunk.

What it adds is the order: every step it derives the microbatch structure from the data,
asks its schedule function for a schedule in the IR, validates it with the static checker
(an invalid schedule is never executed), and runs this rank's action list:

* a forward gathers its inputs (the previous chunk's output, local or received; for LLM chunk
  0, every encoder sub's projected rows), runs the chunk, and keeps what its backward needs,
  as its own memory strategy says (every action carries one): everything; only the inputs
  (recompute: the backward reruns the forward first); everything moved to host memory as
  autograd saves it and back as the backward reads it (offload); or what megatron-core's own
  recompute keeps, set on the chunk for this pair (selective: all but the core attention; the
  first n layers' inputs and the other layers' everything:
  :mod:`pipeweaver.runtime.layer_recompute`);
* a backward takes its output gradient (local or received), runs the chunk's backward and
  routes the input gradients to the producers, part by part for LLM chunk 0;
* sends are ``isend`` and never block; the matching ``irecv`` are posted ahead (no later than
  the rank's preceding send) and waited at the receive action, sends at the end of the step;
  every wait lasts at most the p2p's timeout and then raises
  :class:`~pipeweaver.runtime.p2p.TransferError` naming the action and the peer;
* tensor shapes come from the microbatch metadata (no shape handshake), buffers live on the
  device of this rank's model.

The model side is described by two small protocols, so the runtime knows nothing of the model:

* ``chunk_module(module, chunk)`` returns a module with megatron-core's model contract
  (``set_input_tensor(list)``, ``forward(batch)``) for one chunk on this rank;
* each microbatch from ``data_iterator`` provides ``num_subs(encoder)``,
  ``output_shape(module, sub, last_chunk)`` and ``compute_batch(module, chunk, sub)``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Protocol, Sequence

import torch

from megatron.core.pipeline_parallel.schedules import (
    backward_step,
    deallocate_output_tensor,
    forward_step,
)
from pipeweaver.checker import check
from pipeweaver.dataflow import MicrobatchStructure, consumers, data_inputs
from pipeweaver.ir import Comm, Compute, Kind, Memory, ScheduleError
from pipeweaver.placement import Placement
from pipeweaver.runtime.layer_recompute import pair_recompute
from pipeweaver.runtime.p2p import PipelineP2P
from pipeweaver.schedule import Schedule


class RuntimeMicrobatch(Protocol):
    """What the runtime needs to know of one microbatch."""

    def num_subs(self, encoder: str) -> int:
        """Sub-microbatches of an encoder in this microbatch (0 when it has no units)."""

    def output_shape(self, module: str, sub: int, last_chunk: bool) -> tuple[int, ...]:
        """Shape of a chunk's output: encoder hidden states, an encoder's projected rows (its
        last chunk), or the LLM's hidden states."""

    def compute_batch(self, module: str, chunk: int, sub: int) -> Any:
        """What ``forward_step_func`` receives from its data iterator for one compute."""


ScheduleFn = Callable[[Placement, MicrobatchStructure, Sequence[RuntimeMicrobatch]], Schedule]
"""Makes the step's schedule from the placement, the structure and the microbatches."""

Edge = tuple[Compute, Any]
"""A tensor in flight: the producing compute and, for LLM chunk 0's input gradient, the part."""


class PipelineRuntime:
    """Runs schedules of the IR on one pipeline rank."""

    def __init__(
        self,
        placement: Placement,
        chunk_module: Callable[[str, int], torch.nn.Module],
        p2p: PipelineP2P,
        schedule_fn: ScheduleFn,
        device: torch.device,
        dtype: torch.dtype,
        memory_cap: int | None = None,
        activation_bytes: Callable[[Compute], int] | None = None,
        receives_at_step_start: bool = False,
    ):
        """Args:
        placement: where every chunk lives; fixed for the run.
        chunk_module: this rank's chunk modules, by (module, chunk).
        p2p: transfers between this pipeline's stages.
        schedule_fn: the step's schedule, from its microbatches.
        device: where receive buffers go (the model's device).
        dtype: activation dtype (``config.pipeline_dtype``).
        memory_cap: activation bytes per rank the checker enforces; None: no cap.
        activation_bytes: bytes a forward keeps, for the cap.
        receives_at_step_start: post every receive of a step when it starts, instead of each
            just ahead of the send that follows it (the checker's contract, the least it
            needs): on gloo a receive posted after its tensor was sent starts the transfer in
            the post, and the transport threads it wakes take the poster's core.
        """
        if p2p.num_stages != placement.num_ranks:
            raise ValueError(
                f"the placement has {placement.num_ranks} stages, the pipeline group "
                f"{p2p.num_stages}"
            )
        self.placement = placement
        self.chunk_module = chunk_module
        self.p2p = p2p
        self.rank = p2p.stage
        self.schedule_fn = schedule_fn
        self.device = device
        self.dtype = dtype
        self.memory_cap = memory_cap
        self.last_schedule: Schedule | None = None
        """The schedule of the latest step (for logs, traces and SEMU's prediction)."""
        self.last_microbatches: list = []
        """The microbatches of the latest step."""
        self.activation_bytes = activation_bytes
        self.receives_at_step_start = receives_at_step_start

    @property
    def holds_loss(self) -> bool:
        """Whether this rank runs the last LLM chunk (and so returns the loss dicts)."""
        return self.placement.rank_of("llm", self.placement.num_chunks("llm") - 1) == self.rank

    # ---------------------------------------------------------------------- drop-in

    def forward_backward(
        self,
        *,
        forward_step_func,
        data_iterator,
        model,
        num_microbatches: int,
        seq_length: int | None = None,
        micro_batch_size: int | None = None,
        decoder_seq_length: int | None = None,
        forward_only: bool = False,
        collect_non_loss_data: bool = False,
        first_val_step: bool | None = None,
        adjust_tensor_shapes_fn=None,
        p2p_communicator=None,
        pg_collection=None,
        force_all_reduce: bool | None = False,
    ) -> list:
        """megatron-core's ``forward_backward_func`` contract, executing this step's schedule.

        ``seq_length``, ``micro_batch_size`` and ``decoder_seq_length`` are accepted and unused:
        shapes come from each microbatch's metadata.
        """
        if adjust_tensor_shapes_fn is not None:
            raise ValueError("adjust_tensor_shapes_fn is not supported by the OrchWeave runtime")
        from megatron.core.utils import get_model_config

        models = model if isinstance(model, list) else [model]
        config = get_model_config(models[0])
        iterator = data_iterator[0] if isinstance(data_iterator, list) else data_iterator
        microbatches = [next(iterator) for _ in range(num_microbatches)]
        structure = MicrobatchStructure(
            num_microbatches,
            {e: tuple(mb.num_subs(e) for mb in microbatches) for e in self.placement.encoders},
        )
        spans = _spans(config)
        with spans("schedule", 1):
            schedule = self.schedule_fn(self.placement, structure, microbatches)
            # Never execute an invalid schedule: the checker names the first offending action.
            check(
                schedule,
                memory_cap=self.memory_cap,
                activation_bytes=self.activation_bytes if self.memory_cap is not None else None,
            )
        self.last_schedule = schedule
        self.last_microbatches = microbatches
        store: list = []
        total_tokens = torch.zeros([], dtype=torch.int, device=self.device)
        no_sync = contextlib.nullcontext
        if not forward_only and config.no_sync_func is not None:
            no_sync = config.no_sync_func
        with no_sync():
            total_tokens += _Step(
                self, schedule, microbatches, forward_step_func, config, forward_only,
                collect_non_loss_data, store,
            ).run()  # fmt: skip
        if not forward_only and config.finalize_model_grads_func is not None:
            config.finalize_model_grads_func(
                models,
                total_tokens if config.calculate_per_token_loss else None,
                pg_collection=pg_collection,
                force_all_reduce=force_all_reduce,
            )
        return store if self.holds_loss else []


def _spans(config):
    """The timer spans of ``config.timers`` (``span(name, level, detail)``, as the trainer's
    ``megatron.mllm.timers.StepTimers`` offers), or spans that time nothing."""
    timers = getattr(config, "timers", None)
    if timers is None or not hasattr(timers, "span"):
        return _no_span
    return timers.span


def _no_span(name: str, level: int, detail: str | None = None):
    return contextlib.nullcontext()


def _offloaded_saved_tensors(device: torch.device):
    """Autograd hooks that keep the activations a forward saves for its backward in host memory
    (pinned, copied back asynchronously, on a GPU). Leaves stay: parameters and the chunk's
    inputs are resident anyway (SEMU counts the inputs as the offloaded pair's kept bytes).
    Always a copy: on a CPU device the saved tensor would otherwise alias one the pipeline
    later frees (``deallocate_output_tensor``)."""
    pin = device.type == "cuda"

    def pack(tensor: torch.Tensor):
        if tensor.is_leaf:
            return None, tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=pin)
        host.copy_(tensor)
        return tensor.device, host

    def unpack(packed) -> torch.Tensor:
        where, host = packed
        return host if where is None else host.to(where, non_blocking=pin)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


class _Step:
    """One rank's execution of one schedule."""

    def __init__(
        self,
        runtime: PipelineRuntime,
        schedule: Schedule,
        microbatches,
        forward_step_func,
        config,
        forward_only: bool,
        collect_non_loss_data: bool,
        store: list,
    ):
        self.rt = runtime
        self.placement = schedule.placement
        self.structure = schedule.structure
        self.actions = schedule.actions[runtime.rank]
        self.microbatches = microbatches
        self.forward_step_func = forward_step_func
        self.config = config
        self.forward_only = forward_only
        self.collect_non_loss_data = collect_non_loss_data
        self.store = store
        self.saved: dict[Compute, tuple[list, Any]] = {}  # F compute -> (inputs, output)
        self.local: dict[Edge, torch.Tensor] = {}  # tensors for consumers on this rank
        self.outbox: dict[Edge, torch.Tensor] = {}  # tensors waiting for their send action
        self.inbox: dict[Edge, tuple[torch.Tensor, Any]] = {}  # posted receives
        self.received: dict[Edge, torch.Tensor] = {}
        self.sends: list[tuple[Comm, Any, torch.Tensor]] = []  # (action, work, tensor kept alive)
        self.posted = 0
        self.tokens = torch.zeros([], dtype=torch.int, device=runtime.device)
        self.spans = _spans(config)
        # megatron-core's "these gradients are final" hook (set with --overlap-grad-reduce,
        # megatron.mllm.grad_overlap): called after each chunk's last backward on this rank.
        self.grad_sync = None if forward_only else getattr(config, "grad_sync_func", None)
        self.last_backward = (
            {}
            if self.grad_sync is None
            else {
                (a.module, a.chunk): i
                for i, a in enumerate(self.actions)
                if isinstance(a, Compute) and a.kind is Kind.B
            }
        )

    def run(self) -> torch.Tensor:
        """Execute every action; returns this rank's count of loss tokens."""
        spans = self.spans
        for i, action in enumerate(self.actions):
            self._post_receives(i)
            if isinstance(action, Comm):
                if self.forward_only and action.tensor.kind is Kind.B:
                    continue
                if action.is_send:
                    with spans("send-post", 2, str(action)):
                        self._send(action)
                else:
                    with spans("recv-wait", 2, str(action)):
                        self._wait(action)
            elif action.kind is Kind.F:
                with spans("forward-compute", 2, str(action)):
                    self._forward(action)
            elif not self.forward_only:
                with spans("backward-compute", 2, str(action)):
                    self._backward(action)
                if (
                    self.grad_sync is not None
                    and self.last_backward[action.module, action.chunk] == i
                ):
                    self.grad_sync(self.rt.chunk_module(action.module, action.chunk).parameters())
        with spans("send-drain", 2):
            for comm, work, _ in self.sends:
                self.rt.p2p.wait(work, str(comm), comm.peer)
        return self.tokens

    # ---------------------------------------------------------------------- communication

    def _post_receives(self, i: int) -> None:
        """Post the irecvs up to the next send after action ``i`` (the checker's contract), or
        every one of the step at its first action (``receives_at_step_start``)."""
        horizon = len(self.actions) if self.rt.receives_at_step_start else i + 1
        while horizon < len(self.actions):
            a = self.actions[horizon]
            if isinstance(a, Comm) and a.is_send:
                break
            horizon += 1
        while self.posted < horizon:
            a = self.actions[self.posted]
            self.posted += 1
            if not isinstance(a, Comm) or a.is_send:
                continue
            if self.forward_only and a.tensor.kind is Kind.B:
                continue
            with self.spans("recv-post", 2, str(a)):
                buf = torch.empty(self._shape(a), dtype=self.rt.dtype, device=self.rt.device)
                self.inbox[a.edge] = (buf, self.rt.p2p.irecv(buf, a.peer))

    def _shape(self, comm: Comm) -> tuple[int, ...]:
        t = comm.tensor
        mb = self.microbatches[t.microbatch]
        if t.kind is Kind.F:
            last = t.chunk == self.placement.num_chunks(t.module) - 1
            return tuple(mb.output_shape(t.module, t.sub, last))
        if comm.part is not None:  # LLM chunk 0's input gradient for one encoder sub
            encoder, sub = comm.part
            return tuple(mb.output_shape(encoder, sub, True))
        return tuple(mb.output_shape(t.module, t.sub, False))  # gradient of chunk c-1's output

    def _send(self, comm: Comm) -> None:
        tensor = self.outbox.pop(comm.edge).contiguous()
        self.sends.append((comm, self.rt.p2p.isend(tensor, comm.peer), tensor))

    def _wait(self, comm: Comm) -> None:
        buf, work = self.inbox.pop(comm.edge)
        self.rt.p2p.wait(work, str(comm), comm.peer)
        self.received[comm.edge] = buf

    def _take(self, edge: Edge, activation: bool) -> torch.Tensor:
        """A compute's input (activation) or output gradient, from this rank or the network."""
        tensor = self.local.pop(edge, None)
        if tensor is None:
            tensor = self.received.pop(edge, None)
        if tensor is None:
            raise ScheduleError(f"{edge[0]} (part {edge[1]}) is not available here", self.rt.rank)
        if activation:
            # Each chunk is its own autograd graph; gradients cross explicitly.
            tensor = tensor.detach().requires_grad_(True)
        return tensor

    def _deliver(self, edge: Edge, tensor: torch.Tensor, consumer: Compute) -> None:
        if self.placement.rank_of(consumer.module, consumer.chunk) == self.rt.rank:
            self.local[edge] = tensor
        else:
            self.outbox[edge] = tensor

    # ---------------------------------------------------------------------- compute

    def _is_loss_compute(self, a: Compute) -> bool:
        return a.module == "llm" and a.chunk == self.placement.num_chunks("llm") - 1

    def _run_forward(self, a: Compute, inputs: list, store: list):
        batch = self.microbatches[a.microbatch].compute_batch(a.module, a.chunk, a.sub)
        module = self.rt.chunk_module(a.module, a.chunk)
        with pair_recompute(module, a):
            return self._forward_step(a, module, batch, inputs, store)

    def _forward_step(self, a: Compute, module, batch, inputs: list, store: list):
        output, tokens = forward_step(
            self.forward_step_func,
            iter([batch]),
            module,
            len(self.microbatches),
            inputs,
            store,
            self.config,
            1,
            collect_non_loss_data=self.collect_non_loss_data,
            is_first_microbatch=a.microbatch == 0,
            current_microbatch=a.microbatch,
            is_last_stage=self._is_loss_compute(a),
        )
        return output, tokens

    def _forward(self, a: Compute) -> None:
        edges = data_inputs(a, self.placement, self.structure)
        inputs = [self._take(edge, activation=True) for edge in edges] or [None]
        loss_compute = self._is_loss_compute(a)
        keep = not self.forward_only and a.memory is not Memory.RECOMPUTE
        if not keep:
            context = torch.no_grad()
        elif a.memory is Memory.OFFLOAD:
            context = _offloaded_saved_tensors(self.rt.device)
        else:
            context = contextlib.nullcontext()
        with context:
            output, tokens = self._run_forward(a, inputs, self.store)
        if loss_compute:
            self.tokens += tokens
        out = output[0]
        if not self.forward_only:
            self.saved[a.key] = (inputs, out if keep else None)
        if loss_compute:
            return
        # The consumer gets the values; this rank keeps only the graph (Megatron's trick).
        for consumer, part in consumers(a, self.placement, self.structure):
            self._deliver((a.key, part), out.detach(), consumer)
        if keep:
            deallocate_output_tensor(out, self.config.deallocate_pipeline_outputs)

    def _backward(self, a: Compute) -> None:
        inputs, out = self.saved.pop(a.key.partner())
        if out is None:  # recompute: rerun the forward with autograd on the saved inputs
            output, _ = self._run_forward(a, inputs, [])
            out = output[0]
            deallocate_output_tensor(
                out, self.config.deallocate_pipeline_outputs and not self._is_loss_compute(a)
            )
        # The output gradient (none for the loss compute, whose backward starts from the loss).
        edges = data_inputs(a, self.placement, self.structure)
        grad = self._take(edges[0], activation=False) if edges else None
        # A checkpoint of megatron-core's recompute reruns its forward here: the same settings.
        with pair_recompute(self.rt.chunk_module(a.module, a.chunk), a):
            grads = backward_step(inputs, out, grad, self.config)
        # One input gradient per input of the forward; consumers() lists their consumers in the
        # order of the forward's data_inputs(), which is the order of ``inputs``.
        for (consumer, part), g in zip(consumers(a, self.placement, self.structure), grads):
            self._deliver((a.key, part), g, consumer)
