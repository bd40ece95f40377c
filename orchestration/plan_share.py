# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""One balance plan per host: the planning workers of a DP group's ranks on one machine share
each answer instead of each computing it.

Every rank of a DP group makes the same plan from the same gathered values (the plan digest
holds them to it), so on a host with several ranks of the group every planning worker spends
a core's time on one and the same result (on the 2-core CPU main job at token scale 1/8, the
two workers took 14 ms of CPU per iteration, 8.4 ms with the share). With a share, each job
comes with the iteration it plans; the first worker to claim it (an exclusive create of
``ITERATION.claim`` in the group's directory) runs it and writes its pickled answer
(``ITERATION.answer``, written whole, then renamed into place), and the others read that
answer. Ranks on another host have another directory and plan for themselves, so no rank needs
to know which ranks share its host.

Sharing is only a saving, never a dependency: a reader whose claimer is gone (its claim file
deleted, no answer written) or that waits past its bound runs the job itself, and a worker
that cannot create or write a file runs the job and answers its own rank as without a share.

The files stay small and few: each worker deletes the files of the iterations it claimed once
they are two behind the one it is asked for (every rank of the group took those plans before
this job was submitted: the metadata gather of the iteration between them is a collective),
and each rank removes the directory when it closes (a reader that still wanted an answer then
plans for itself).

Imported by the planning worker: nothing heavy at module level.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

POLL_S = 1e-3
"""How long a reader sleeps between looks for the answer: a plan takes milliseconds and is
made an iteration ahead, so a millisecond late costs nothing, and fewer wake-ups cost less CPU."""


def share_root() -> str:
    """Where the groups' directories go: ``/dev/shm`` (memory, always local to the host) where
    it exists, else the temporary directory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


@dataclass(frozen=True)
class PlanShare:
    """The directory of one DP group's shared plans on this host (see the module docstring)."""

    directory: str
    """Unique to the group and the run: the group agrees on a random token at start-up."""

    wait_s: float
    """The longest a reader waits for another worker's answer before it runs the job itself."""

    @classmethod
    def for_group(cls, token: int, wait_s: float, root: str | None = None) -> "PlanShare":
        """The share of the group whose ranks all hold ``token``."""
        return cls(os.path.join(root or share_root(), f"orchweave-plans-{token:016x}"), wait_s)

    def close(self) -> None:
        """Remove the directory and what is left in it (idempotent)."""
        shutil.rmtree(self.directory, ignore_errors=True)


class ShareWorkerState:
    """What one planning worker remembers of its share: the iterations it claimed."""

    def __init__(self):
        self.claimed: dict[str, list[int]] = {}
        """Per directory, the iterations this worker claimed and whose files are still there."""

    def answer(self, share: PlanShare, iteration: int,
               run: Callable[[], bytes]) -> tuple[bytes, bool]:  # fmt: skip
        """The pickled answer of ``iteration``'s job: run here (``run()``) when this worker
        claims it first or the claimer is gone, else read from the claimer's file.

        Returns:
            The answer's bytes, and whether this worker ran the job.
        """
        self._tidy(share.directory, iteration - 2)
        claim = _path(share.directory, iteration, "claim")
        try:
            os.makedirs(share.directory, exist_ok=True)
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            raw = _read_answer(share.directory, iteration, share.wait_s)
            if raw is not None:
                return raw, False
            return run(), True
        except OSError:  # no directory here: plan alone
            return run(), True
        self.claimed.setdefault(share.directory, []).append(iteration)
        raw = run()
        _write_answer(share.directory, iteration, raw)
        return raw, True

    def _tidy(self, directory: str, up_to: int) -> None:
        """Delete the files of this worker's claims of iterations <= ``up_to`` (no rank reads
        them any more; a reader that still found the claim would plan itself once it is gone)."""
        mine = self.claimed.get(directory, [])
        for it in [i for i in mine if i <= up_to]:
            _unlink(_path(directory, it, "answer"), _path(directory, it, "claim"))
            mine.remove(it)

    def close(self) -> None:
        """Delete every file this worker claimed (its rank's close removes the directory)."""
        for directory in list(self.claimed):
            self._tidy(directory, float("inf"))


def _path(directory: str, iteration: int, kind: str) -> str:
    return os.path.join(directory, f"{iteration}.{kind}")


def _unlink(*paths: str) -> None:
    """Delete the files that are there (another rank's close may have removed them)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _write_answer(directory: str, iteration: int, raw: bytes) -> None:
    """Write the answer whole, then rename it into place (a reader never sees part of it); a
    failure only means the readers run the job themselves once the claim is gone."""
    final = _path(directory, iteration, "answer")
    tmp = f"{final}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
        os.replace(tmp, final)
    except OSError:
        _unlink(tmp, _path(directory, iteration, "claim"))


def _read_answer(directory: str, iteration: int, wait_s: float) -> bytes | None:
    """The claimer's answer once it is there; None when the claim is gone without one or the
    wait passes ``wait_s``."""
    answer, claim = _path(directory, iteration, "answer"), _path(directory, iteration, "claim")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(answer, "rb") as f:
                return f.read()
        except FileNotFoundError:
            pass
        except OSError:
            return None
        if not os.path.exists(claim) or time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)
