# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Is this the host a calibration was measured on? A short probe, and the times rescaled if not.

A calibration's times hold on the host that measured them. ``tools/calibrate.py`` records that
host (:func:`host_record`: CPU model, cores, torch threads) and a probe of its speed
(:func:`run_probe`, about a second: a fixed single-threaded matrix-multiply loop and a fixed
Python-overhead loop, the two kinds of work the CPU job's step time is made of, each the median
of several repeats). Whoever loads a calibration to predict times (SEMU, the balancer's cost
model) passes it through :func:`fit_to_host`, which reruns the probe (once per process) and,
when this host is more than :data:`TOLERANCE` faster or slower, warns with the factor and
returns the calibration with every time scaled by it (``strict``: raises
:class:`CalibrationHostError` instead).

The factor is the geometric mean of the two probes' ratios (this host over the recorded one):
one number, because a calibration's times mix both kinds of work and are not split by kind.

``ORCHWEAVE_CALIBRATION_PROBE=0`` switches the probe off (the test suite does: its timing must
not depend on a probe); then :func:`fit_to_host` returns calibrations unchanged.
"""

from __future__ import annotations

import math
import os
import platform
import sys
import time
from typing import Callable, Mapping

from orchestration.calibration import Calibration

TOLERANCE = 0.10
"""The relative difference of host speed beyond which a calibration is rescaled (or refused)."""

PROBE_ENV = "ORCHWEAVE_CALIBRATION_PROBE"
"""Set to ``0`` to disable the probe (tests)."""

_PROBE: dict[str, float] | None = None  # this process's probe result (it runs once)
_WARNED: set[str] = set()  # files already warned about in this process


class CalibrationHostError(ValueError):
    """A calibration measured on a host whose speed differs by more than :data:`TOLERANCE`,
    loaded with ``--strict-calibration``."""


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else the platform's)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def host_record(torch_threads: int) -> dict[str, object]:
    """What identifies the host a calibration is measured on."""
    return {"cpu": cpu_name(), "cores": os.cpu_count() or 0, "torch_threads": int(torch_threads)}


def _matmul_loop() -> float:
    """Seconds of a fixed loop of 128 x 128 float32 matrix multiplies on one torch thread."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(128, 128, generator=gen)
        b = torch.randn(128, 128, generator=gen)
        out = torch.empty(128, 128)
        t = time.perf_counter()
        for _ in range(2000):
            torch.matmul(a, b, out=out)
        return time.perf_counter() - t
    finally:
        torch.set_num_threads(previous)


def _python_loop() -> float:
    """Seconds of a fixed loop of Python calls, attribute and dict work (interpreter speed)."""

    class Node:
        __slots__ = ("key", "value")

        def __init__(self, key, value):
            self.key = key
            self.value = value

    t = time.perf_counter()
    table: dict = {}
    for i in range(100000):
        node = Node(i & 255, i)
        table[node.key] = table.get(node.key, 0) + node.value
    return time.perf_counter() - t


def run_probe(repeats: int = 7) -> dict[str, float]:
    """The fastest of ``repeats`` runs of each probe loop (about 0.05 s each on the CPU job's
    host: the whole probe takes about a second), after one untimed warm-up of each.

    The fastest, not the median: the probe identifies the host's speed, and other work on a
    shared host only ever slows a loop down; a median moved with the load at each start-up
    (measured: SEMU's predictions of one schedule differed by up to 30% between runs).
    """
    _matmul_loop()
    _python_loop()
    matmul = [_matmul_loop() for _ in range(repeats)]
    python = [_python_loop() for _ in range(repeats)]
    return {"matmul_s": min(matmul), "python_s": min(python)}


def probe_enabled() -> bool:
    """Whether :func:`host_probe` runs (``ORCHWEAVE_CALIBRATION_PROBE`` is not ``0``)."""
    return os.environ.get(PROBE_ENV, "1").strip() not in ("0", "false", "no", "off")


def host_probe() -> dict[str, float] | None:
    """This host's probe, run once per process; None when the probe is disabled."""
    global _PROBE
    if not probe_enabled():
        return None
    if _PROBE is None:
        _PROBE = run_probe()
    return _PROBE


def adopt_probe(probe: Mapping[str, float]) -> None:
    """Use ``probe`` as this process's probe (another process measured it: every rank of a job
    must scale its costs by the same factor, or their plans could differ)."""
    global _PROBE
    _PROBE = {k: float(v) for k, v in probe.items()}


def host_factor(recorded: Mapping[str, float], measured: Mapping[str, float]) -> float | None:
    """How many times slower this host is than the recorded one: the geometric mean of the
    probes' ratios (measured / recorded) over the probes both have; None if they share none."""
    keys = [
        k for k in ("matmul_s", "python_s") if recorded.get(k, 0) > 0 and measured.get(k, 0) > 0
    ]
    if not keys:
        return None
    logs = [math.log(measured[k] / recorded[k]) for k in keys]
    return math.exp(sum(logs) / len(logs))


def warn_line(line: str) -> None:
    """Print a warning line on stderr (the default ``warn`` of :func:`fit_to_host`)."""
    print(line, file=sys.stderr, flush=True)


def mark_warned(line: str) -> None:
    """A silent ``warn`` (ranks other than the one that prints); later calls stay silent too."""


def fit_to_host(
    calibration: Calibration,
    *,
    strict: bool = False,
    probe: Callable[[], Mapping[str, float] | None] = host_probe,
    warn: Callable[[str], None] | None = warn_line,
) -> Calibration:
    """``calibration`` as it holds on this host.

    Unchanged when it records no probe, when the probe is disabled, when it was already
    scaled, or when this host's speed is within :data:`TOLERANCE` of the recorded one.
    Otherwise one ``warning:`` line (once per file and process; ``warn=None``: silent) and the
    calibration with every time scaled by the factor (``machine["applied_factor"]`` says so).

    Args:
        calibration: as loaded (``Calibration.load``).
        strict: refuse a different host instead of rescaling (``--strict-calibration``).
        probe: this host's probe (default: :func:`host_probe`, cached per process).
        warn: receives the warning line.

    Raises:
        CalibrationHostError: ``strict`` and the host differs by more than the tolerance.
    """
    recorded = calibration.machine.get("probe")
    if not recorded or "applied_factor" in calibration.machine:
        return calibration
    measured = probe()
    if not measured:
        return calibration
    factor = host_factor(recorded, measured)
    if factor is None or abs(factor - 1.0) <= TOLERANCE:
        return calibration
    where = calibration.path or "the calibration"
    speed = f"{factor:.2f}x the recorded probe's time"
    if strict:
        raise CalibrationHostError(
            f"{where}: this host runs the calibration probe at {speed} (measured on "
            f"{calibration.machine.get('cpu', 'another host')}); recalibrate here "
            "(tools/calibrate.py) or drop --strict-calibration to rescale"
        )
    if warn is not None and where not in _WARNED:
        _WARNED.add(where)
        warn(
            f"warning: {where} was measured on another host ({calibration.machine.get('cpu', '?')}"
            f"): this one runs its probe at {speed}; scaling its times by {factor:.3f}"
        )
    scaled = calibration.scaled(factor)
    scaled.machine = {**calibration.machine, "applied_factor": factor}
    scaled.path = calibration.path
    return scaled


def load_calibration(path: str, *, strict: bool = False) -> Calibration:
    """``Calibration.load(path)`` passed through :func:`fit_to_host`.

    Raises:
        ValueError: the file is missing or malformed.
        CalibrationHostError: ``strict`` and another host (see :func:`fit_to_host`).
    """
    return fit_to_host(Calibration.load(path), strict=strict)
