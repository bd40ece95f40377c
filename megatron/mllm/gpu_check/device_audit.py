# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Where a training step's tensors live: the hook that finds work left on the host.

:class:`DeviceAudit` watches a step run on an accelerator and records every tensor that ends
up elsewhere:

* every ATen operator whose result is a tensor on another device than the run's (a
  ``TorchDispatchMode``, so the backward's operators are seen too), attributed to the innermost
  frame of this repository that called it (``megatron/mllm/batch.py:174 thd_params``), or to
  ``megatron-core``/``torch`` when none of our frames is on the stack;
* every ``nn.Module`` output off the device (a global forward hook);
* after the step, every parameter, gradient buffer (``main_grad``) and optimizer state off it.

Small host tensors are how metadata travels (sequence offsets, counts: a few elements per
sample), so an operator of ours counts as *work left on the host* only past
:data:`HOST_METADATA_ELEMENTS` elements; the smaller ones are counted apart. On a CPU run (the
dry run) nothing is off the device and the audit reports nothing, which is the point of running
its code there: it must not rot.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

REPO = Path(__file__).resolve().parents[3]
"""The repository root: frames under it (outside ``tests/``) are our code."""

OURS = ("megatron/mllm/", "orchestration/", "pipeweaver/")
"""Our packages, relative to :data:`REPO`."""

HOST_METADATA_ELEMENTS = 4096
"""Host tensors up to this many elements made by our code are metadata (offsets, counts)."""


@dataclass
class AuditReport:
    """What one audited step left off its device."""

    device: str
    """The run's device."""

    ours: Counter = field(default_factory=Counter)
    """``site: count`` of our operators whose result exceeded the metadata size off-device."""

    ours_metadata: Counter = field(default_factory=Counter)
    """``site: count`` of our small off-device results (metadata)."""

    outside: Counter = field(default_factory=Counter)
    """``origin op: count`` of off-device results of megatron-core or torch."""

    module_outputs: Counter = field(default_factory=Counter)
    """``module class: count`` of module outputs off the device."""

    state: list[str] = field(default_factory=list)
    """Parameters, gradient buffers and optimizer states off the device, by name."""

    @property
    def clean(self) -> bool:
        """No work of ours off the device: no large operator result, module output or state."""
        return not (self.ours or self.module_outputs or self.state)

    def record(self) -> dict:
        """The JSON form (the largest five of each list)."""

        def top(c: Counter) -> dict[str, int]:
            return dict(c.most_common(5))

        return {
            "device": self.device,
            "clean": self.clean,
            "ours_off_device": top(self.ours),
            "ours_metadata_ops": sum(self.ours_metadata.values()),
            "outside_off_device": top(self.outside),
            "module_outputs_off_device": top(self.module_outputs),
            "state_off_device": self.state[:5],
        }


@functools.lru_cache(maxsize=4096)
def _where(filename: str) -> tuple[str | None, bool]:
    """A frame's file: its path in the repository and whether it is ours, else a short path
    outside (``megatron/core/...``) and False; None for torch's own files."""
    path = Path(filename)
    try:
        rel = path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        rel = None
    if rel == "megatron/mllm/cpu_shim.py":
        # The CPU shim only forwards operators (it exists only without CUDA): the site is
        # whoever called it.
        return None, False
    if rel is not None and rel.startswith(OURS):
        return rel, True
    if "/torch/" in path.as_posix():
        return None, False
    parts = path.parts
    return ("/".join(parts[parts.index("megatron") :]) if "megatron" in parts else path.name), False


def _site() -> tuple[str, bool]:
    """The innermost frame of ours on the stack (``path:line function``), and whether there
    is one; otherwise the innermost frame outside torch. Walks the frames without reading
    their source (``traceback.extract_stack`` would, for every operator)."""
    frame = sys._getframe(3)  # past this function, found() and the mode's dispatch
    outside = None
    while frame is not None:
        where, ours = _where(frame.f_code.co_filename)
        if ours:
            return f"{where}:{frame.f_lineno} {frame.f_code.co_name}", True
        if outside is None and where is not None:
            outside = f"{where}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return outside or "torch", False


class _OffDevice(TorchDispatchMode):
    def __init__(self, audit: "DeviceAudit"):
        super().__init__()
        self.audit = audit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != self.audit.device.type:
                self.audit.found(str(func.overloadpacket.__name__), t.numel())
                break
        return out


class DeviceAudit:
    """Context manager: records what a step leaves off ``device`` (see the module docstring).

    Args:
        device: the run's device; CPU runs record nothing (everything is on the device).
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.report = AuditReport(str(self.device))
        self._mode = _OffDevice(self)
        self._hook = None

    def found(self, op: str, elements: int) -> None:
        """One off-device result of operator ``op`` with ``elements`` elements."""
        site, ours = _site()
        if not ours:
            self.report.outside[f"{op} at {site}"] += 1
        elif elements > HOST_METADATA_ELEMENTS:
            self.report.ours[f"{op} at {site}"] += 1
        else:
            self.report.ours_metadata[site] += 1

    def _module_output(self, module, args, output) -> None:
        for t in tree_flatten(output)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != self.device.type:
                self.report.module_outputs[type(module).__name__] += 1
                return

    def __enter__(self) -> "DeviceAudit":
        self._hook = torch.nn.modules.module.register_module_forward_hook(self._module_output)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._hook.remove()

    def check_state(self, model: torch.nn.Module, optimizer=None) -> None:
        """Record parameters, gradient buffers and optimizer states off the device."""
        for name, p in model.named_parameters():
            for what, t in (("", p), (".main_grad", getattr(p, "main_grad", None))):
                if t is not None and t.device.type != self.device.type:
                    self.report.state.append(name + what)
        states = getattr(optimizer, "chained_optimizers", None) or [optimizer]
        for opt in states:
            inner = getattr(opt, "optimizer", None)
            for i, state in enumerate(getattr(inner, "state", {}).values()):
                for key, t in state.items():
                    off = isinstance(t, torch.Tensor) and t.numel() > 1
                    if off and t.device.type != self.device.type:
                        self.report.state.append(f"optimizer state {i}.{key}")
