# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""Activation memory: the bytes autograd keeps for backward, counted per storage.

:class:`SavedTensorTracker` is installed with ``torch.autograd.graph.saved_tensors_hooks``
(:meth:`SavedTensorTracker.hooks`). Every tensor autograd saves is counted once per storage
(parameters excluded: they are static memory, not activations) from the moment it is saved
until autograd releases it: the saved object is a holder that the graph node owns, and freeing
the node frees the holder. It reports the bytes alive now (after a forward: what the forward
keeps for its backward) and the peak over its life (a training step's activation peak).

The calibration counts what one chunk's forward keeps; ``tools/bench/semu_memory_probe.py``
counts the peak of every training step.
"""

from __future__ import annotations

from typing import Iterable

import torch


class SavedTensorTracker:
    """Bytes of unique storages saved for backward and still referenced by autograd."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        """Args:
        exclude: tensors whose storages are not counted (a module's parameters).
        """
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.refs: dict[int, int] = {}
        self.alive = 0
        """Bytes saved and not yet released."""
        self.peak = 0
        """Most bytes alive at once so far."""

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        """The context in which autograd reports what it saves to this tracker."""
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t: torch.Tensor):
        """``pack_hook``: wrap ``t`` in a holder that counts its storage while it lives."""
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr in self.exclude or st.nbytes() == 0:
            return t
        return _Holder(self, t, ptr, st.nbytes())

    @staticmethod
    def unpack(obj):
        """``unpack_hook``: the saved tensor."""
        return obj.t if isinstance(obj, _Holder) else obj

    def _add(self, ptr: int, nbytes: int) -> None:
        count = self.refs.get(ptr, 0)
        if count == 0:
            self.alive += nbytes
            self.peak = max(self.peak, self.alive)
        self.refs[ptr] = count + 1

    def _drop(self, ptr: int, nbytes: int) -> None:
        count = self.refs.get(ptr, 0) - 1
        if count <= 0:
            self.refs.pop(ptr, None)
            self.alive -= nbytes
        else:
            self.refs[ptr] = count


class _Holder:
    """What autograd stores in place of a saved tensor: counted while the graph holds it."""

    __slots__ = ("tracker", "t", "ptr", "nbytes")

    def __init__(self, tracker: SavedTensorTracker, t: torch.Tensor, ptr: int, nbytes: int):
        self.tracker, self.t, self.ptr, self.nbytes = tracker, t, ptr, nbytes
        tracker._add(ptr, nbytes)

    def __del__(self):
        self.tracker._drop(self.ptr, self.nbytes)
