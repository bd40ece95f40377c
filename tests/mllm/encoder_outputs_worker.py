# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""torchrun worker for test_encoder_outputs.py: the overlapped second and third hops on 4 ranks.

Every encoder row carries its unit's index and its row within the unit, so the LLM side can
check that each sample gets exactly its own rows, in order, before and after the exchange; the
loss weights each row by its own value, so every gradient that comes back names where it went.
"""

import sys

import numpy as np
import torch
import torch.distributed as dist

from megatron.mllm.steps.encoder_outputs import EncoderOutputs
from orchestration.cost_model import CostModel
from orchestration.dispatcher import Dispatcher
from orchestration.metadata import GatheredMetadata
from orchestration.microbatches import overlap_order
from orchestration.model_shape import ModelShape, TransformerShape
from orchestration.phase_plan import plan_iteration
from orchestration.workload_spec import WorkloadGenerator, WorkloadSpec

COST = CostModel.build(
    ModelShape(
        llm=TransformerShape(2, 32, 64, 4, causal=True),
        encoders={
            "vision": TransformerShape(1, 32, 64, 4),
            "audio": TransformerShape(1, 32, 64, 4),
        },
    )
)


def unit_rows(items: np.ndarray, tokens: np.ndarray) -> torch.Tensor:
    """Rows ``[item, row, item * 1000 + row]`` of these units, back to back."""
    out = [[i, j, i * 1000 + j] for i in items.tolist() for j in range(int(tokens[i]))]
    return torch.tensor(out, dtype=torch.float64).view(-1, 3)


def weight(rows: torch.Tensor) -> torch.Tensor:
    """The loss's weight of each row: its own value, so a gradient names its row."""
    return rows.detach()[:, 2:3] * 0.5 + 1.0


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    disp = Dispatcher(None)
    gen = WorkloadGenerator(WorkloadSpec.load("omni-three-modality"), seed=5, token_scale=0.05)
    checked_local = checked_remote = 0
    for trial in range(6):
        base = trial * 100
        # Uneven ranks, so balancing moves units; with 4 ranks a rank's home rows sit between
        # rows from lower and higher ranks, at another offset in its send order than in its
        # arrival order.
        ranks = [[(k, gen.sample(k)) for k in range(base + r * 25, base + r * 25 + 2 + 3 * r)]
                 for r in range(world)]  # fmt: skip
        md = GatheredMetadata.from_rank_samples(ranks)
        plan = plan_iteration(md, COST, algorithm="none" if trial == 0 else "lpt+refine")
        leaves, hidden, lens = {}, {}, {}
        for enc in ("vision", "audio"):
            phase = plan.phase(enc)
            mine = phase.dispatch.dst_items(rank)
            lens[enc] = phase.items.tokens[mine].astype(np.int64)
            leaves[enc] = unit_rows(mine, phase.items.tokens).requires_grad_(True)
            hidden[enc] = leaves[enc] * 1.0  # in a graph, as an encoder's output is
        outputs = EncoderOutputs.start(disp, plan, hidden, lens, requires_grad=True)
        llm = plan.phase("llm")
        samples = [int(llm.items.sample[i]) for i in llm.dispatch.dst_items(rank)]

        def expected(enc: str, s: int) -> tuple[torch.Tensor, bool]:
            """Sample ``s``'s rows of ``enc`` in destination order, and whether all stayed."""
            route, items = plan.to_llm[enc], plan.phase(enc).items
            sel = np.flatnonzero((route.dst == rank) & (items.sample == s))
            sel = sel[np.argsort(route.dst_pos[sel], kind="stable")]
            return unit_rows(sel, items.tokens), bool(np.all(route.src[sel] == rank))

        def consume(group: list[int]) -> None:
            """Check and back-propagate the rows of these samples, one at a time."""
            for s in group:
                for enc in ("vision", "audio"):
                    want, _ = expected(enc, s)
                    if not want.shape[0]:
                        continue
                    got = outputs.rows(enc, [s])
                    assert torch.equal(got.detach(), want), (trial, rank, enc, s, got, want)
                    (got * weight(got)).sum().backward()

        home = plan.home_samples(rank)
        is_local = [s in home for s in samples]
        for s, flag in zip(samples, is_local):
            assert flag == all(expected(e, s)[1] for e in ("vision", "audio")), (trial, s)
        first, middle, last = overlap_order(is_local)
        groups = [[samples[i] for i in g] for g in (first, middle, last)]
        consume(groups[0])  # the exchange may still be in flight
        outputs.arrive(requires_grad=True)
        consume(groups[1])
        back = outputs.start_gradients()
        consume(groups[2])
        for enc, g in outputs.gradients(back).items():
            torch.autograd.backward(outputs.sent[enc], g)
            # Every unit row is used by exactly one sample: its gradient is its own weight.
            assert torch.equal(leaves[enc].grad, weight(leaves[enc]).expand(-1, 3)), (trial, enc)
        checked_local += len(groups[0]) + len(groups[2])
        checked_remote += len(groups[1])
    totals = torch.tensor([checked_local, checked_remote])
    dist.all_reduce(totals)
    assert totals[0] > 0 and totals[1] > 0, totals  # both kinds were exercised
    print(f"rank {rank}: ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
