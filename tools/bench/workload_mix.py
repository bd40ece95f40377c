# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""A workload spec with one component's share changed: how a benchmark sweeps a data mix that a
paper does not state (``paper_tables.py``, DIP's Table 4)."""

from __future__ import annotations

import json
import os


def with_component_share(
    spec_path: str | os.PathLike, name_part: str, share: float, directory: str
) -> str:
    """The spec at ``spec_path`` with every component whose name holds ``name_part`` drawn for
    ``share`` of the samples in all (the others keep their proportions), written in
    ``directory``; the new file's path."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    chosen = [name_part in c["name"] for c in spec["components"]]
    if not any(chosen) or all(chosen) or not 0.0 <= share <= 1.0:
        raise ValueError(f"{spec_path}: cannot give the components named '{name_part}' {share}")
    picked = sum(c["weight"] for c, x in zip(spec["components"], chosen) if x)
    others = sum(c["weight"] for c, x in zip(spec["components"], chosen) if not x)
    for c, x in zip(spec["components"], chosen):
        c["weight"] = c["weight"] / picked * share if x else c["weight"] / others * (1.0 - share)
    path = os.path.join(directory, f"{spec['name']}-{name_part}-{share:g}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path
