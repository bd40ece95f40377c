# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The per-phase step's second and third hops, overlapped with the LLM microbatches.

After the encoder phases, every encoder's unit outputs go to the LLM-phase worker of their
sample (one packed all-to-all), and in the backward their gradients come back (one transposed
all-to-all). Neither needs the step to stand still:

- the rows an encoder worker computed for its own LLM samples never travel (the exchange's
  *home* rows); they become the LLM's leaves at once, so the microbatches whose samples have
  every encoder row at home (*local* microbatches) can run while the others' rows are in
  flight;
- the gradients of the rows that came from other ranks are complete once the last microbatch
  using them has run its backward, so their exchange back can run beside the remaining local
  microbatches.

The step therefore runs its microbatches in three groups (``orchestration.microbatches.
overlap_order`` over ``IterationPlan.home_samples``): the first half of the local ones while the
outputs travel, then those that need other ranks' rows, then the rest of the local ones while
the gradients travel back. Every microbatch computes what it
computed before; only the order in which gradients accumulate changes. On a GPU the
exchanges run on NCCL's stream beside the kernels; on gloo in its worker thread, and a rank
that arrives early computes instead of waiting for the slowest.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from orchestration.dispatcher import Dispatcher, PendingExchange
from orchestration.packed_exchange import with_home


@dataclass
class EncoderOutputs:
    """One iteration's encoder outputs on their way to this rank's LLM microbatches.

    Rows are addressed in *arrival order* (source rank, then destination position: the order
    of the receive buffer): ``sample_rows[enc]`` maps each sample to its rows there.
    """

    dispatcher: Dispatcher
    """Where the exchanges run."""

    sent: dict[str, torch.Tensor]
    """Per encoder, the rows this rank computed, in send order (in the encoder's graph)."""

    home: dict[str, torch.Tensor]
    """Per encoder, the leaf of the rows that stayed here (usable before the exchange ends)."""

    pending: PendingExchange
    """The outputs' exchange, in flight until :meth:`arrive`."""

    sample_rows: dict[str, tuple[np.ndarray, dict[int, tuple[int, int]]]]
    """Per encoder, the arrival-order row of each destination-order row, and per sample its
    range of destination-order rows (``EncoderArrivals``)."""

    remote: dict[str, torch.Tensor] | None = None
    """Per encoder, the leaf of the rows that came from other ranks (after :meth:`arrive`)."""

    arrived: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per encoder, every arrival in arrival order: home and remote rows (after
    :meth:`arrive`)."""

    @classmethod
    def start(cls, dispatcher: Dispatcher, plan, hidden: dict[str, torch.Tensor],
              lens: dict[str, np.ndarray], requires_grad: bool) -> "EncoderOutputs":  # fmt: skip
        """Start the outputs' exchange.

        Args:
            dispatcher: where the exchange runs.
            plan: the iteration's ``IterationPlan`` (its ``to_llm`` routes).
            hidden: per encoder, the outputs this rank computed, its units' rows back to back
                in its encoder-phase order (in the encoder's graph).
            lens: per encoder, rows of each of those units.
            requires_grad: whether the leaves get gradients (not in a forward-only step).
        """
        me = dispatcher.rank
        sent, parts, sample_rows = {}, [], {}
        for enc, rows in hidden.items():
            route = plan.to_llm[enc]
            sent[enc] = dispatcher.send_rows(route, rows, lens[enc])
            parts.append((sent[enc].detach(), route.rows_matrix()))
            arrivals = plan.encoder_arrivals(enc, me)
            sample_rows[enc] = (arrivals.order, arrivals.sample_rows)
        pending = dispatcher.start_exchange(parts, label="encoder outputs")
        home = {
            enc: pending.layout.home(p, sent[enc]).detach().requires_grad_(requires_grad)
            for p, enc in enumerate(sent)
        }
        return cls(dispatcher, sent, home, pending, sample_rows)

    def _part(self, enc: str) -> int:
        """``enc``'s part in the exchanges."""
        return list(self.sent).index(enc)

    def home_range(self, enc: str) -> tuple[int, int]:
        """Arrival-order rows of ``enc``'s home block: ``[start, stop)``."""
        layout, p = self.pending.layout, self._part(enc)
        start = layout.home_offset(p)
        return start, start + layout.home_span(p)[1]

    def arrival_rows(self, enc: str, sample: int) -> np.ndarray:
        """Arrival-order rows of one sample's outputs of ``enc`` (empty if it has none)."""
        order, rows_of = self.sample_rows[enc]
        if sample not in rows_of:
            return np.zeros(0, dtype=np.int64)
        return order[np.arange(*rows_of[sample])]

    def _home_rows(self, enc: str, rows: np.ndarray) -> np.ndarray | None:
        """``rows`` (arrival order) as rows of the home leaf, or None if some came from
        another rank."""
        start, stop = self.home_range(enc)
        if rows.size and (rows.min() < start or rows.max() >= stop):
            return None
        return rows - start

    def rows(self, enc: str, samples: Sequence[int]) -> torch.Tensor:
        """The encoder rows of ``samples``, in their order (destination order within each):
        off the home leaf when all stayed (usable while the exchange runs), else off every
        arrival (after :meth:`arrive`)."""
        rows = np.concatenate([self.arrival_rows(enc, s) for s in samples])
        home = self._home_rows(enc, rows)
        if home is not None:
            source, rows = self.home[enc], home
        else:
            assert self.remote is not None, "rows from other ranks read before they arrived"
            source = self.arrived[enc]
        return source.index_select(0, torch.as_tensor(rows, device=source.device))

    def arrive(self, requires_grad: bool) -> float:
        """Wait for the outputs' exchange; the seconds spent blocked."""
        start = time.perf_counter()
        got = self.pending.wait()
        seconds = time.perf_counter() - start
        self.remote = {}
        for p, enc in enumerate(self.sent):
            self.remote[enc] = got[p].requires_grad_(requires_grad)
            at = self.pending.layout.home_offset(p)
            self.arrived[enc] = with_home(self.remote[enc], at, self.home[enc])
        return seconds

    def start_gradients(self) -> PendingExchange:
        """Start sending the gradients of the rows from other ranks back to their sources (all
        of them are complete once the microbatches needing other ranks' rows have run)."""
        parts = []
        for enc, leaf in self.remote.items():
            back = self.pending.layout.counts[self._part(enc)].T.copy()
            np.fill_diagonal(back, 0)  # the home rows' gradients are here already
            g = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
            parts.append((g, back))
        return self.dispatcher.start_exchange(parts, label="encoder outputs backward")

    def gradients(self, back: PendingExchange) -> dict[str, torch.Tensor]:
        """Per encoder, the gradient of :attr:`sent` (in send order): the home leaf's and the
        ones that came back (waits for ``back``)."""
        got = back.wait()
        layout = self.pending.layout
        out = {}
        for p, enc in enumerate(self.sent):
            home = self.home[enc]
            g = home.grad if home.grad is not None else torch.zeros_like(home)
            out[enc] = with_home(got[p], layout.home_span(p)[0], g)
        return out
