# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""TensorBoard and Weights & Biases, with Megatron's flags: the trainer's metrics as scalars.

The trainer builds one :class:`MetricWriters` at start-up, on every rank, and hands it every
iteration's metrics record, the same dict it appends to ``--metrics-jsonl``::

    writers = MetricWriters.from_run(run, rank, world_size)   # raises ConfigError
    ...
    writers.write(iteration, record)                          # every iteration, every rank
    ...
    writers.close()                                           # flushes; also a context manager

As in Megatron-LM, only the last global rank (the one that holds the loss) writes; on the other
ranks :meth:`~MetricWriters.write` does nothing. The flags are Megatron's own, read from
``RunConfig.logger`` (``megatron.training.config.LoggerConfig``):

* ``--tensorboard-dir DIR``: event files in ``DIR`` (``torch.utils.tensorboard``), with
  ``--tensorboard-queue-size`` events buffered between flushes;
* ``--wandb-project P`` (``--wandb-exp-name``, ``--wandb-entity``, ``--wandb-save-dir``): a wandb
  run, offline unless ``WANDB_MODE`` says otherwise, in ``<save dir>/wandb/`` (wandb's layout;
  the save dir defaults to ``--tensorboard-dir``, else the working directory);
* ``--tensorboard-log-interval N``: both write every N-th iteration (Megatron's default 1);
* ``--log-timers-to-tensorboard``: the record's ``timers`` are written too.

A record becomes scalars by :func:`record_scalars`: nested dicts flatten into tags
(``imbalance/vision``), per-rank lists into their ``min``, ``max`` and ``mean``
(``timers/forward-backward/max``), and throughput is derived as the log line derives it
(``samples_per_s``, ``tokens_per_s``, ``tflops_per_gpu``). Values that are not numbers (None
included) are skipped. In a ``timers`` entry shaped as ``megatron.mllm.timers`` records one
iteration (``seconds``, ``depth``, ``partition``, ``collectives``), the per-name ``seconds``
are the timers' own tags and ``depth`` (the log's indentation) is left out.

Both backends are optional extras (``orchweave[tensorboard]``, ``orchweave[wandb]``), imported
only when asked for; asking for one that is not installed is a ``ConfigError`` on every rank,
so that every rank stops at start-up with the same ``error:`` line.
"""

from __future__ import annotations

import importlib.util
import math
import os
from numbers import Real
from typing import Any, Mapping, Sequence

from megatron.mllm.arguments import ConfigError
from megatron.mllm.metrics import tflops_per_gpu
from megatron.mllm.run_config import RunConfig

TIMERS = "timers"
"""The record's entry of per-rank timer seconds, written only with
``--log-timers-to-tensorboard``."""

SKIPPED_KEYS = frozenset({"iteration"})
"""Record entries that are not scalars of the iteration (the iteration is the step)."""

# In a timers record (megatron.mllm.timers.iteration_record), the per-name seconds are the
# timers themselves: their tags read timers/<name>/max, not timers/seconds/<name>/max. The
# nesting depths only indent the log.
_TIMERS_HOISTED = "seconds"
_TIMERS_SKIPPED = frozenset({"depth", "exclusive", "spans"})

PREDICTION = "prediction"
"""The record's entry of what was predicted for the iteration (``--step-prediction``)."""

# Per-action seconds and the stages' rank numbers are no figures to plot over time.
_PREDICTION_SKIPPED = frozenset({"actions_s", "ranks"})


def _number(value: Any) -> float | None:
    """``value`` as a float, or None when it is not a number (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    return float(value)


def _reduce(values: Sequence[Any]) -> dict[str, float]:
    """``min``, ``max`` and ``mean`` of the numbers of a per-rank list (empty if none)."""
    numbers = [x for x in map(_number, values) if x is not None]
    if not numbers:
        return {}
    return {"min": min(numbers), "max": max(numbers), "mean": math.fsum(numbers) / len(numbers)}


def flatten(value: Any, tag: str) -> dict[str, float]:
    """The scalars of one record entry under ``tag``.

    Args:
        value: a number, a dict (its keys extend the tag), a list or tuple of numbers (one per
            rank: its ``min``, ``max`` and ``mean``), or anything else (skipped).
        tag: the entry's tag, e.g. ``imbalance``.

    Returns:
        Tag -> value, e.g. ``{"imbalance/vision": 1.5, "imbalance/llm": 1.2}``.
    """
    if isinstance(value, Mapping):
        out: dict[str, float] = {}
        for key, sub in value.items():
            out.update(flatten(sub, f"{tag}/{key}"))
        return out
    if isinstance(value, (list, tuple)):
        return {f"{tag}/{k}": v for k, v in _reduce(value).items()}
    number = _number(value)
    return {} if number is None else {tag: number}


def _timer_scalars(timers: Any) -> dict[str, float]:
    if not isinstance(timers, Mapping):
        return flatten(timers, TIMERS)
    out = flatten(timers.get(_TIMERS_HOISTED, {}), TIMERS)
    rest = {k: v for k, v in timers.items() if k != _TIMERS_HOISTED and k not in _TIMERS_SKIPPED}
    out.update(flatten(rest, TIMERS))
    return out


def throughput(record: Mapping[str, Any], world_size: int) -> dict[str, float]:
    """Samples and tokens per second and model TFLOP/s per GPU of one iteration, as the log line
    computes them (``megatron.mllm.metrics.format_log_line``); empty without a positive
    ``iteration_time_s``."""
    seconds = _number(record.get("iteration_time_s"))
    if seconds is None or not seconds > 0:
        return {}
    out = {}
    for key, tag in (("samples", "samples_per_s"), ("tokens", "tokens_per_s")):
        if (n := _number(record.get(key))) is not None:
            out[tag] = n / seconds
    if (flops := _number(record.get("flops"))) is not None:
        out["tflops_per_gpu"] = tflops_per_gpu(flops, seconds, world_size)
    return out


def record_scalars(
    record: Mapping[str, Any], world_size: int, timers: bool = False
) -> dict[str, float]:
    """Every scalar TensorBoard and wandb get from one metrics record.

    Args:
        record: what the trainer writes to ``--metrics-jsonl`` for one iteration.
        world_size: processes of the run (for ``tflops_per_gpu``).
        timers: include the ``timers`` entry (``--log-timers-to-tensorboard``).

    Returns:
        Tag -> value, in the record's order, then the derived throughput.
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in SKIPPED_KEYS:
            continue
        if key == TIMERS:
            if timers:
                out.update(_timer_scalars(value))
            continue
        if key == PREDICTION and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in _PREDICTION_SKIPPED}
        out.update(flatten(value, key))
    out.update(throughput(record, world_size))
    return out


# --------------------------------------------------------------------------------------------
# The backends


def _install_hint(extra: str) -> str:
    return f"pip install 'orchweave[{extra}]'"


def _require(module: str, flag: str, extra: str) -> None:
    """Raise a ConfigError naming ``flag`` and the extra when ``module`` cannot be imported.

    Only looks the module up (``importlib.util.find_spec``), without importing it: every rank
    checks, only the writing rank imports.
    """
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent missing, or a module without a spec
        found = False
    if not found:
        raise ConfigError(_missing(flag, module, extra))


def _missing(flag: str, package: str, extra: str) -> str:
    return f"{flag} needs the {package} package: {_install_hint(extra)}"


class TensorBoardBackend:
    """Scalars into TensorBoard event files (``torch.utils.tensorboard.SummaryWriter``)."""

    def __init__(self, log_dir: str, max_queue: int):
        """Open a writer of event files in ``log_dir`` (created if needed).

        Raises:
            ConfigError: tensorboard is not installed, or ``log_dir`` cannot be created.
        """
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise ConfigError(_missing("--tensorboard-dir", "tensorboard", "tensorboard")) from e
        try:
            self.writer = SummaryWriter(log_dir=log_dir, max_queue=max_queue)
        except OSError as e:
            raise ConfigError(f"--tensorboard-dir {log_dir}: {e.strerror or e}") from e

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One scalar per tag at ``step``."""
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        """Flush the queued events and close the file."""
        self.writer.close()


class WandbBackend:
    """Scalars into a Weights & Biases run (offline unless ``WANDB_MODE`` says otherwise)."""

    def __init__(self, project: str, name: str | None, entity: str | None, root_dir: str,
                 config: Mapping[str, Any]):  # fmt: skip
        """Start the run.

        Args:
            project: ``--wandb-project``.
            name: ``--wandb-exp-name`` (None: wandb names the run).
            entity: ``--wandb-entity``.
            root_dir: wandb's ``dir``: the run goes to ``root_dir/wandb/``.
            config: the run's flags, recorded with the run.

        Raises:
            ConfigError: wandb is not installed, ``root_dir`` cannot be created, or the run
                cannot start (e.g. online without a login).
        """
        try:
            import wandb
        except ImportError as e:
            raise ConfigError(_missing("--wandb-project", "wandb", "wandb")) from e
        # A training node often has no network: record locally, `wandb sync` later.
        mode = os.environ.get("WANDB_MODE") or "offline"
        try:
            os.makedirs(root_dir, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"--wandb-save-dir {root_dir}: {e.strerror or e}") from e
        try:
            self.run = wandb.init(
                project=project, name=name, entity=entity, dir=root_dir, mode=mode,
                config=dict(config), settings=wandb.Settings(quiet=True),
            )  # fmt: skip
        except wandb.errors.Error as e:
            raise ConfigError(f"--wandb-project {project}: wandb.init failed ({e})") from e

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One history row at ``step``."""
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        """Finish the run and wait until its files are complete."""
        import wandb

        self.run.finish()
        # finish() returns before wandb's service process has written the run's log; tearing
        # the service down waits for it (this process starts no other run).
        wandb.teardown()


def _flags_of(args: Any) -> dict[str, Any]:
    """The parsed flags that wandb can store as the run's config: numbers, strings, None and
    lists of those."""
    if args is None:
        return {}
    simple = (str, int, float, bool, type(None))
    out = {}
    for k, v in sorted(vars(args).items()):
        if isinstance(v, simple) or (
            isinstance(v, (list, tuple)) and all(isinstance(x, simple) for x in v)
        ):
            out[k] = list(v) if isinstance(v, tuple) else v
    return out


class MetricWriters:
    """Where one rank writes the iterations' metrics: TensorBoard, wandb, both or neither.

    Build it with :meth:`from_run`; see the module docstring for the trainer's three calls.
    """

    def __init__(self, backends: Sequence[Any] = (), *, interval: int = 1, world_size: int = 1,
                 timers: bool = False):  # fmt: skip
        """Writers over ``backends``; :meth:`from_run` builds them from a run's flags.

        Args:
            backends: objects with ``write(step, scalars)`` and ``close()``; none on a rank
                that does not write.
            interval: write every ``interval``-th iteration (``--tensorboard-log-interval``).
            world_size: processes of the run (for ``tflops_per_gpu``).
            timers: write the record's ``timers`` (``--log-timers-to-tensorboard``).

        Raises:
            ConfigError: ``interval`` is below 1.
        """
        if interval < 1:
            raise ConfigError(f"--tensorboard-log-interval must be >= 1, got {interval}")
        self.backends = list(backends)
        self.interval = interval
        self.world_size = world_size
        self.timers = timers

    @classmethod
    def from_run(cls, run: RunConfig, rank: int, world_size: int) -> "MetricWriters":
        """The writers ``run``'s flags ask for, on global rank ``rank`` of ``world_size``.

        Call it on every rank: every rank checks that the requested packages are installed;
        only the last rank opens the event files and the wandb run.

        Args:
            run: the ``RunConfig``; reads ``run.logger`` (Megatron's ``LoggerConfig``).
            rank: this process's global rank.
            world_size: processes of the run.

        Raises:
            ConfigError: a requested backend is not installed (the message names the flag and
                the extra to install), its directory cannot be created, or wandb cannot start.
        """
        log = run.logger
        tb_dir, project = log.tensorboard_dir, log.wandb_project
        if tb_dir:
            _require("tensorboard", "--tensorboard-dir", "tensorboard")
        if project:
            _require("wandb", "--wandb-project", "wandb")
        options = dict(
            interval=log.tensorboard_log_interval,
            world_size=world_size,
            timers=log.log_timers_to_tensorboard,
        )
        if rank != world_size - 1:
            return cls((), **options)
        backends: list[Any] = []
        try:
            if tb_dir:
                backends.append(TensorBoardBackend(tb_dir, log.tensorboard_queue_size))
            if project:
                root = log.wandb_save_dir or tb_dir or os.getcwd()
                backends.append(
                    WandbBackend(project, log.wandb_exp_name, log.wandb_entity, root,
                                 _flags_of(getattr(run, "args", None)))
                )  # fmt: skip
        except ConfigError:
            for b in backends:
                b.close()
            raise
        return cls(backends, **options)

    @property
    def active(self) -> bool:
        """Whether this rank writes anything."""
        return bool(self.backends)

    def write(self, iteration: int, record: Mapping[str, Any]) -> None:
        """Write ``record``'s scalars at step ``iteration`` when it is on the interval.

        Args:
            iteration: the iteration just trained (1-based, as in the log line).
            record: the iteration's ``--metrics-jsonl`` record.
        """
        if not self.backends or iteration % self.interval:
            return
        scalars = record_scalars(record, self.world_size, self.timers)
        for b in self.backends:
            b.write(iteration, scalars)

    def close(self) -> None:
        """Flush and close every backend (idempotent)."""
        backends, self.backends = self.backends, []
        for b in backends:
            b.close()

    def __enter__(self) -> "MetricWriters":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
