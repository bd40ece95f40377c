# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The Batch Post-Balancing Dispatcher's collectives: metadata all-gather and all-to-all.

Everything here moves rows of tensors between the ranks of one data-parallel group according to
a *count matrix* ``counts[src, dst]`` (rows that ``src`` sends to ``dst``), which every rank
derives from the same balance plan. Receivers therefore know their sizes without a handshake.

Two exchange algorithms, with identical results:

- **direct**: one ``all_to_all_single``;
- **node-wise**: three all-to-alls that make every pair of nodes exchange exactly one message:
  traffic from node A to node B is first gathered inside A onto the rank with local index
  ``B % gpus_per_node`` (the proxy), crosses the network once to the rank of node B with local
  index ``A % gpus_per_node``, and is scattered inside B to its final ranks. Intra-node traffic
  goes straight to its destination in the first hop. With ``n`` nodes of ``g`` ranks this turns
  up to ``(n g)^2`` small inter-node messages into at most ``n (n - 1)`` larger ones. Which
  rank holds which rows after each hop is :func:`orchestration.hops.plan_hops`'.

With ``differentiable=True`` the all-to-all is autograd-aware: its backward runs the transposed
exchange, so gradients of encoder outputs travel back to the ranks that computed them.
:meth:`Dispatcher.move` carries out one :class:`~orchestration.routing.Route` of a plan;
:meth:`Dispatcher.gather_metadata` is the all-gather every plan starts from.

Every collective lasts at most its group's timeout (``--distributed-timeout-minutes``, given to
the group when it was created); one that fails or expires raises :class:`CollectiveError`,
naming this rank, the collective and the group, instead of the backend's traceback. (On NCCL a
collective returns once it is enqueued; NCCL's watchdog enforces the timeout.)
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from orchestration.hops import plan_hops
from orchestration.locality import group_ranks_per_node
from orchestration.metadata import (
    GatheredMetadata,
    PlanError,
    check_digests,
    decode_strings,
    encode_rank_metadata,
    encode_strings,
)
from orchestration.packed_exchange import PackedLayout
from orchestration.routing import Route, row_index
from orchestration.workload import SampleMeta

# -------------------------------------------------------------------------------- collectives


class CollectiveError(Exception):
    """A collective of the dispatcher that failed or did not complete within its group's
    timeout; the message names this rank, the collective and the group.

    Attributes:
        rank: this process's global rank.
        collective: which collective (``all-to-all 'vision outputs backward'``).
        group_ranks: the global ranks of the group.
    """

    def __init__(self, message: str, rank: int, collective: str, group_ranks: Sequence[int]):
        super().__init__(message)
        self.rank = rank
        self.collective = collective
        self.group_ranks = tuple(group_ranks)


class Dispatcher:
    """Collectives of the balancer over one data-parallel process group."""

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        node_wise: bool = False,
        gpus_per_node: int | None = None,
        timers=None,
    ):
        """Args:
        group: the data-parallel group (None: the default group).
        node_wise: use the node-wise (three-hop) exchange.
        gpus_per_node: global ranks per node (``--gpus-per-node``); needed by the node-wise
            exchange. The group's own count (:attr:`gpus_per_node`: fewer with tensor or
            pipeline parallelism) follows from its members' global ranks.
        timers: where collectives report their time: an object whose
            ``span(name, level, detail=, group=)`` is a context manager (the trainer's
            ``megatron.mllm.timers.StepTimers``); None times nothing.
        """
        self.group = group
        self.timers = timers
        self.group_ranks = tuple(dist.get_process_group_ranks(group or dist.group.WORLD))
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if node_wise and not gpus_per_node:
            raise ValueError("--node-wise-a2a needs --gpus-per-node")
        per_node = group_ranks_per_node(self.group_ranks, gpus_per_node) if gpus_per_node else 1
        if node_wise and per_node is None:  # equal runs always divide the group
            raise ValueError(
                f"--node-wise-a2a: the data-parallel group's ranks {list(self.group_ranks)} do "
                f"not fill nodes of --gpus-per-node {gpus_per_node} in equal runs"
            )
        self.node_wise = node_wise
        self.gpus_per_node = per_node or 1
        """Members of the group per node, in group rank order (each its own node when the
        group's nodes are irregular): the node-aware placement's and the exchange's unit."""
        self.bytes_moved = 0
        """Bytes that crossed ranks in every exchange since :meth:`reset_counters`, summed over
        all ranks (the same number on every rank: it comes from the count matrices)."""
        self.exchanges: list[tuple[str | None, float, float]] = []
        """Since :meth:`reset_counters`, per :meth:`exchange_many` that ran: its label, its
        busiest rank's bytes (sent or received, the larger; the same on every rank) and this
        rank's seconds in it (waiting for the others included)."""

    def reset_counters(self) -> None:
        """Zero the byte counter and forget the exchanges recorded."""
        self.bytes_moved = 0
        self.exchanges = []

    def all_gather_arrays(
        self, local: np.ndarray, what: str = "array all-gather"
    ) -> list[np.ndarray]:
        """Every rank's 1-D int64 array (the encoded metadata), in group rank order.

        Two collectives: the lengths, then the arrays padded to the longest. ``what`` names
        them in a :class:`CollectiveError`.
        """
        local = np.ascontiguousarray(local, dtype=np.int64)
        device = self._device()
        size = torch.tensor([local.size], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        with self._failing_as(f"{what} (sizes)"):
            dist.all_gather(sizes, size, group=self.group)
        longest = max(int(x) for x in sizes)
        padded = torch.zeros(longest, dtype=torch.int64, device=device)
        padded[: local.size] = torch.from_numpy(local).to(device)
        out = [torch.zeros_like(padded) for _ in range(self.world)]
        with self._failing_as(what):
            dist.all_gather(out, padded, group=self.group)
        return [o[: int(n)].cpu().numpy() for o, n in zip(out, sizes)]

    def gather_metadata(self, local: Sequence[tuple[int, SampleMeta]]) -> GatheredMetadata:
        """All-gather every DP rank's sample metadata and ids: the table every plan starts from.

        Args:
            local: this rank's (stream index, metadata) pairs, in loading order.
        """
        return self.gather_batches([local])[0][0]

    def gather_batches(self, batches: Sequence[Sequence[tuple[int, SampleMeta]]],
                       control: np.ndarray | None = None,
                       ) -> tuple[list[GatheredMetadata], list[np.ndarray]]:  # fmt: skip
        """One all-gather for the metadata of several iterations and a few control words.

        The trainer gathers the next iteration's metadata one iteration early, so that its plan
        can be computed while the current one runs; what the ranks must also agree on (the
        digest of the plan about to run, measured times) rides along as ``control`` instead of
        costing a collective of its own.

        Args:
            batches: per iteration, this rank's (stream index, metadata) pairs.
            control: this rank's int64 control words (any length; empty if None).

        Returns:
            The gathered metadata of each iteration, and every rank's control words in group
            rank order.
        """
        control = np.zeros(0, np.int64) if control is None else np.asarray(control, np.int64)
        parts = [encode_rank_metadata(local) for local in batches]
        head = [len(control), len(parts), *(p.size for p in parts)]
        # The sample ids ride along as words: two all-gathers in all (sizes, then words).
        ids = encode_strings([meta.sample_id for local in batches for _, meta in local])
        encoded = np.concatenate([np.array(head, np.int64), control, *parts, ids])
        with self._timed("metadata-gather"):
            flat = self.all_gather_arrays(encoded, "metadata all-gather")
        controls, per_batch = [], [[] for _ in batches]
        ids_of = [[] for _ in batches]
        for words in flat:
            n_control, n_parts = int(words[0]), int(words[1])
            if n_parts != len(batches):
                raise PlanError(
                    f"metadata all-gather: a rank sent {n_parts} iterations' metadata, this "
                    f"rank {len(batches)}"
                )
            sizes = words[2 : 2 + n_parts]
            start = 2 + n_parts
            controls.append(words[start : start + n_control])
            start += n_control
            counts = []
            for b, size in enumerate(sizes.tolist()):
                part = words[start : start + size]
                per_batch[b].append(part)
                counts.append(int(part[1]))  # the part's sample count
                start += size
            rank_ids, _ = decode_strings(words[start:])
            for b, n in enumerate(counts):  # a rank's ids come iteration by iteration
                ids_of[b].extend(rank_ids[:n])
                rank_ids = rank_ids[n:]
        gathered = [
            GatheredMetadata.from_flat(per_batch[b], sample_ids=ids_of[b])
            for b in range(len(batches))
        ]
        return gathered, controls

    def _device(self) -> torch.device:
        # NCCL collectives need CUDA tensors; gloo takes CPU ones.
        if dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def check_digest(
        self, digest: str, what: str = "balance plan", group: dist.ProcessGroup | None = None
    ) -> None:
        """Raise :class:`PlanDigestMismatch` naming the ranks whose digest differs from rank 0's.

        Args:
            digest: this rank's digest.
            what: names the digest in the error.
            group: where the digests must agree; default the whole world, since every DP
                group (one per pipeline stage, one per TP rank) plans the same samples.
        """
        gathered: list[Any] = [None] * dist.get_world_size(group)
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        with self._timed("plan-digest", group=ranks):
            with self._failing_as(f"{what} digest all-gather", ranks):
                dist.all_gather_object(gathered, digest, group=group)
        check_digests(gathered, what)

    def move(self, route: Route, local_rows: torch.Tensor, local_sizes: np.ndarray,
             differentiable: bool = False, label: str | None = None) -> torch.Tensor:  # fmt: skip
        """Send each local item's rows where ``route`` says; return the arrivals.

        Args:
            route: the plan's route for this exchange.
            local_rows: this rank's items' rows back to back, in its source-list order.
            local_sizes: rows of each local item.
            differentiable: let gradients of the arrivals flow back the same way.
            label: names the exchange in the timers (``vision inputs``).

        Returns:
            The rows received, in arrival order (:meth:`Route.arrival_order`).
        """
        send = self.send_rows(route, local_rows, local_sizes)
        return self.all_to_all(send, route.rows_matrix(), differentiable, label)

    def send_rows(self, route: Route, local_rows: torch.Tensor,
                  local_sizes: np.ndarray) -> torch.Tensor:  # fmt: skip
        """This rank's rows of ``route``'s items in send order (grouped by destination): what
        :meth:`exchange_many` takes. An index_select, so gradients flow back to ``local_rows``."""
        idx = row_index(route.send_index(self.rank), local_sizes)
        return local_rows.index_select(0, torch.as_tensor(idx, device=local_rows.device))

    def exchange_many(self, parts: Sequence[tuple[torch.Tensor, np.ndarray]],
                      label: str | None = None) -> list[torch.Tensor]:  # fmt: skip
        """Several exchanges in one all-to-all (:meth:`start_exchange`, waited for at once).

        Args:
            parts: per part, this rank's rows ordered by destination rank (as
                :meth:`all_to_all` takes them) and its ``[world, world]`` row counts.
            label: names the exchange in the timers and in a :class:`CollectiveError`.

        Returns:
            Per part, the rows received, ordered by source rank, in the part's dtype and shape
            (the home rows included); when nothing moves, the parts' own tensors.
        """
        pending = self.start_exchange(parts, label)
        remote = pending.wait()
        if pending.layout.moves_nothing:
            return [rows for rows, _ in parts]
        layout = pending.layout
        return [
            layout.assemble(p, got, layout.home(p, rows))
            for p, (got, (rows, _)) in enumerate(zip(remote, parts))
        ]

    def start_exchange(self, parts: Sequence[tuple[torch.Tensor, np.ndarray]],
                       label: str | None = None) -> "PendingExchange":  # fmt: skip
        """Start several exchanges as one all-to-all; :meth:`PendingExchange.wait` ends it.

        Each part's rows that change rank travel as bytes in one packed buffer, split by one
        byte-count matrix (``orchestration.packed_exchange``); the rows a part keeps home never
        travel, so the caller can compute on them (:meth:`PackedLayout.home`) while the others
        are in flight. An exchange costs a latency per collective on every rank, however
        little it carries, so a step moves all the payloads of one hop together. When no part
        moves a row across ranks (every plan kept its items where they were loaded), nothing
        is sent at all: every rank sees the same counts, so all skip alike.

        The direct exchange is posted here and runs in the background (gloo's worker thread,
        or NCCL's stream); the node-wise one, three dependent all-to-alls, runs at the wait.
        Every rank must wait for its exchanges in the order it started them.

        Args:
            parts: per part, this rank's rows ordered by destination rank and its row counts.
            label: names the exchange in the timers and in a :class:`CollectiveError`.
        """
        for rows, c in parts:
            self._check_counts(rows, np.asarray(c, dtype=np.int64))
        layout = PackedLayout.of(parts, self.rank)
        device = parts[0][0].device if parts else self._device()
        pending = PendingExchange(self, layout, label, device)
        if layout.moves_nothing:
            return pending
        pending.send = layout.pack([rows for rows, _ in parts])
        if self.node_wise:
            return pending
        byte_counts = layout.byte_counts
        self.bytes_moved += int(byte_counts.sum())
        pending.recv = pending.send.new_empty(int(byte_counts[:, self.rank].sum()))
        what = "all-to-all" if label is None else f"all-to-all '{label}'"
        with self._failing_as(what):
            pending.work = dist.all_to_all_single(
                pending.recv,
                pending.send,
                output_split_sizes=[int(n) for n in byte_counts[:, self.rank]],
                input_split_sizes=[int(n) for n in byte_counts[self.rank]],
                group=self.group,
                async_op=True,
            )
        return pending

    def all_to_all(self, rows: torch.Tensor, counts: np.ndarray, differentiable: bool = False,
                   label: str | None = None) -> torch.Tensor:  # fmt: skip
        """Send rows to their destinations.

        Args:
            rows: this rank's rows, ordered by destination rank (``counts[me, d]`` rows for
                each ``d`` in turn).
            counts: ``[world, world]`` rows from src to dst, identical on every rank.
            differentiable: the backward sends gradients back the same way (transposed).
            label: names the exchange in the timers; the backward's is ``label + " backward"``.

        Returns:
            The rows received, ordered by source rank (``counts[s, me]`` rows per ``s``).
        """
        counts = np.asarray(counts, dtype=np.int64)
        if differentiable:
            return _AllToAll.apply(rows, self, counts, label)
        with self._timed("all-to-all", label):
            return self._exchange(rows, counts, label)

    def _timed(self, name: str, detail: str | None = None, group: Sequence[int] | None = None):
        """A timer span of one collective of this group (nothing without timers)."""
        if self.timers is None:
            return contextlib.nullcontext()
        return self.timers.span(name, 1, detail=detail, group=group or self.group_ranks)

    @contextlib.contextmanager
    def _failing_as(self, collective: str, group: Sequence[int] | None = None):
        """Turn the backend's failure of the collective inside into a :class:`CollectiveError`
        naming ``collective`` and its group (this dispatcher's, unless ``group`` says)."""
        start = time.monotonic()
        try:
            yield
        except RuntimeError as e:  # gloo raises RuntimeError, NCCL DistBackendError (a subclass)
            ranks = tuple(group or self.group_ranks)
            rank = dist.get_rank()
            reason = (str(e).strip() or type(e).__name__).splitlines()[0]
            raise CollectiveError(
                f"rank {rank} gave up in the {collective} of group {list(ranks)} after "
                f"{time.monotonic() - start:.1f} s: {reason}",
                rank,
                collective,
                ranks,
            ) from e

    def _exchange(
        self, rows: torch.Tensor, counts: np.ndarray, label: str | None = None
    ) -> torch.Tensor:
        """The all-to-all itself: direct, or node-wise in three hops; ``label`` names it in a
        :class:`CollectiveError`."""
        what = "all-to-all" if label is None else f"all-to-all '{label}'"
        self._check_counts(rows, counts)
        row_bytes = rows.element_size() * int(np.prod(rows.shape[1:], dtype=np.int64))
        self.bytes_moved += row_bytes * int(counts.sum() - np.trace(counts))
        if not self.node_wise:
            send_sizes = [int(c) for c in counts[self.rank]]
            recv_sizes = [int(c) for c in counts[:, self.rank]]
            return self._all_to_all_single(rows, send_sizes, recv_sizes, what)
        held = {}  # (src, dst) -> the block of rows this rank holds now
        offset = 0
        for d in range(self.world):
            n = int(counts[self.rank, d])
            if n:
                held[(self.rank, d)] = rows[offset : offset + n]
                offset += n
        hops = plan_hops(counts, self.gpus_per_node)
        for number, hop in enumerate(hops, 1):
            send_blocks = hop.blocks[self.rank]
            parts = [held[b] for p in range(self.world) for b in send_blocks[p]]
            send_sizes = [sum(int(counts[b]) for b in send_blocks[p]) for p in range(self.world)]
            recv_blocks = [hop.blocks[p][self.rank] for p in range(self.world)]
            recv_sizes = [sum(int(counts[b]) for b in recv_blocks[p]) for p in range(self.world)]
            send = torch.cat(parts) if parts else rows.new_empty((0, *rows.shape[1:]))
            recv = self._all_to_all_single(
                send, send_sizes, recv_sizes, f"{what}, node-wise hop {number} of {len(hops)}"
            )
            held = {}
            offset = 0
            for p in range(self.world):
                for b in recv_blocks[p]:
                    n = int(counts[b])
                    held[b] = recv[offset : offset + n]
                    offset += n
        parts = [held[(s, self.rank)] for s in range(self.world) if counts[s, self.rank] > 0]
        return torch.cat(parts) if parts else rows.new_empty((0, *rows.shape[1:]))

    def _check_counts(self, rows: torch.Tensor, counts: np.ndarray) -> None:
        """``counts`` is ``[world, world]`` and sends exactly the rows this rank holds."""
        if counts.shape != (self.world, self.world):
            raise ValueError(f"counts must be [{self.world}, {self.world}], got {counts.shape}")
        if rows.shape[0] != counts[self.rank].sum():
            raise ValueError(
                f"rank {self.rank} holds {rows.shape[0]} rows but the plan sends "
                f"{int(counts[self.rank].sum())}"
            )

    def _all_to_all_single(
        self, send: torch.Tensor, send_sizes: list[int], recv_sizes: list[int], what: str
    ) -> torch.Tensor:
        """One variable-size all-to-all of rows over the group; ``what`` names it."""
        recv = send.new_empty((sum(recv_sizes), *send.shape[1:]))
        with self._failing_as(what):
            dist.all_to_all_single(
                recv,
                send.contiguous(),
                output_split_sizes=recv_sizes,
                input_split_sizes=send_sizes,
                group=self.group,
            )
        return recv


class PendingExchange:
    """A packed exchange started by :meth:`Dispatcher.start_exchange`, not yet waited for."""

    def __init__(self, dispatcher: Dispatcher, layout: PackedLayout, label: str | None,
                 device: torch.device):  # fmt: skip
        self.dispatcher = dispatcher
        self.device = device
        self.layout = layout
        """Where every part's rows travel (its :meth:`~PackedLayout.home` rows stay)."""
        self.label = label
        self.send: torch.Tensor | None = None
        self.recv: torch.Tensor | None = None
        self.work = None
        self._arrived: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        """Block until the exchange is complete (at most the group's timeout; a failure is a
        :class:`CollectiveError`); per part, the rows that arrived from the other ranks,
        ordered by source rank (:meth:`PackedLayout.unpack`). The seconds spent blocked here
        are the exchange's time in :attr:`Dispatcher.exchanges` and the timers: whatever of
        it ran beside the caller's work costs the step nothing."""
        if self._arrived is not None:
            return self._arrived
        disp, layout = self.dispatcher, self.layout
        if self.send is None:  # nothing moves
            self._arrived = layout.unpack(torch.empty(0, dtype=torch.uint8, device=self.device))
            return self._arrived
        what = "all-to-all" if self.label is None else f"all-to-all '{self.label}'"
        start = time.perf_counter()
        with disp._timed("all-to-all", self.label):
            if self.work is None:
                self.recv = disp._exchange(self.send, layout.byte_counts, self.label)
            else:
                with disp._failing_as(what):
                    self.work.wait()
        disp.exchanges.append((self.label, layout.busiest_bytes(), time.perf_counter() - start))
        self._arrived = layout.unpack(self.recv)
        self.send = self.recv = self.work = None
        return self._arrived


class _AllToAll(torch.autograd.Function):
    """All-to-all whose backward is the transposed all-to-all."""

    @staticmethod
    def forward(ctx, rows, dispatcher: Dispatcher, counts: np.ndarray, label: str | None):
        ctx.dispatcher = dispatcher
        ctx.counts = counts
        ctx.label = label
        return dispatcher.all_to_all(rows.detach(), counts, label=label)

    @staticmethod
    def backward(ctx, grad):
        label = None if ctx.label is None else f"{ctx.label} backward"
        back = ctx.dispatcher.all_to_all(grad.contiguous(), ctx.counts.T.copy(), label=label)
        return back, None, None, None
