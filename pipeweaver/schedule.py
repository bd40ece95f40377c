# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The schedule: what every pipeline rank runs, in order, for one training step.

A :class:`Schedule` holds one action list per rank with the placement and the microbatch
structure it was made for. Its string form is one line per rank, and its JSON form stores the
placement, the structure and the action strings (:mod:`pipeweaver.ir`'s grammar).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from pipeweaver.dataflow import MicrobatchStructure
from pipeweaver.ir import Action, Comm, Compute, ScheduleError, parse
from pipeweaver.placement import ChunkPlacement, Placement


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered action lists for one step, with the placement and microbatch structure.

    A *compute-only* schedule lists only :class:`Compute` actions (an order before lowering; SEMU
    simulates it as if lowered); :func:`pipeweaver.lowering.lower` adds the :class:`Comm` actions
    that the runtime executes and the checker validates.
    """

    placement: Placement
    """Where each chunk lives."""

    structure: MicrobatchStructure
    """Microbatches and subs of the step."""

    actions: tuple[tuple[Action, ...], ...]
    """``actions[r]``: rank r's actions in execution order."""

    name: str = ""
    """Which generator made it (for logs and traces)."""

    def __post_init__(self) -> None:
        actions = tuple(tuple(rank) for rank in self.actions)
        if len(actions) != self.placement.num_ranks:
            raise ScheduleError(
                f"the placement has {self.placement.num_ranks} ranks but the schedule lists "
                f"{len(actions)}"
            )
        object.__setattr__(self, "actions", actions)

    @property
    def num_ranks(self) -> int:
        """Pipeline ranks."""
        return self.placement.num_ranks

    @property
    def has_comms(self) -> bool:
        """Whether communication actions are present (a lowered schedule)."""
        return any(isinstance(a, Comm) for rank in self.actions for a in rank)

    def computes(self, rank: int) -> list[Compute]:
        """Rank ``rank``'s compute actions, in order."""
        return [a for a in self.actions[rank] if isinstance(a, Compute)]

    def compute_only(self) -> "Schedule":
        """The same order without communication actions."""
        return Schedule(
            self.placement,
            self.structure,
            tuple(tuple(a for a in rank if isinstance(a, Compute)) for rank in self.actions),
            self.name,
        )

    def format(self) -> str:
        """One line per rank: ``rank R: a0 a1 ...``."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(a) for a in rank) for r, rank in enumerate(self.actions)
        )

    def __str__(self) -> str:
        return self.format()

    @classmethod
    def from_strings(
        cls,
        placement: Placement,
        structure: MicrobatchStructure,
        ranks: Sequence[str | Iterable[str]],
        name: str = "",
    ) -> "Schedule":
        """Build from per-rank strings (``"l0F0 s1:l0F0 ..."``) or lists of action strings."""
        actions = []
        for rank in ranks:
            tokens = rank.split() if isinstance(rank, str) else list(rank)
            actions.append(tuple(parse(t) for t in tokens))
        return cls(placement, structure, tuple(actions), name)

    def to_json(self) -> dict:
        """A JSON object: placement, structure and the per-rank action strings."""
        return {
            "name": self.name,
            "num_ranks": self.num_ranks,
            "placement": {
                m: [[cp.rank, cp.start, cp.stop] for cp in cps]
                for m, cps in self.placement.chunks.items()
            },
            "num_microbatches": self.structure.num_microbatches,
            "subs": {e: list(c) for e, c in self.structure.subs.items()},
            "actions": [[str(a) for a in rank] for rank in self.actions],
        }

    @classmethod
    def from_json(cls, obj: Mapping) -> "Schedule":
        """Inverse of :meth:`to_json`."""
        placement = Placement(
            int(obj["num_ranks"]),
            {
                m: tuple(ChunkPlacement(int(r), int(a), int(b)) for r, a, b in cps)
                for m, cps in obj["placement"].items()
            },
        )
        structure = MicrobatchStructure(
            int(obj["num_microbatches"]), {e: tuple(c) for e, c in obj.get("subs", {}).items()}
        )
        return cls.from_strings(placement, structure, obj["actions"], obj.get("name", ""))
