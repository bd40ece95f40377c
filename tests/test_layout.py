# Copyright (c) 2026 OrchWeave authors. All rights reserved.
"""The rules of docs/architecture.md, read from the source: rooms, imports, collectives, sizes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("megatron/mllm", "orchestration", "pipeweaver")
COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_object", "all_to_all", "all_to_all_single",
    "broadcast", "broadcast_object_list", "barrier", "reduce_scatter", "reduce", "gather",
    "scatter", "send", "recv", "isend", "irecv", "batch_isend_irecv", "new_group",
}  # fmt: skip
"""torch.distributed calls that communicate (or, for new_group, make every rank take part)."""

COLLECTIVE_HOMES = {
    "orchestration/dispatcher.py",
    "pipeweaver/runtime/p2p.py",
    "megatron/mllm/distributed.py",
}
"""The only modules of the packages that call them (docs/architecture.md, the rooms)."""


def _modules(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (REPO / r).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


@pytest.mark.parametrize("root", ["orchestration", "pipeweaver"])
def test_orchestration_and_pipeweaver_never_import_megatron_mllm(root):
    bad = [
        f"{p.relative_to(REPO)} imports {m}"
        for p in _modules(root)
        for m in _imports(p)
        if m == "megatron.mllm" or m.startswith("megatron.mllm.")
    ]
    assert not bad, bad


def test_collectives_are_called_only_in_their_homes():
    calls = []
    for path in _modules(*PACKAGES):
        rel = str(path.relative_to(REPO))
        tree = ast.parse(path.read_text())
        aliases = {
            a.asname or a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for a in node.names
            if a.name == "torch.distributed"
        } | {"dist"}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in COLLECTIVES
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in aliases
                and rel not in COLLECTIVE_HOMES
            ):
                calls.append(f"{rel}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    assert not calls, calls


def test_no_package_module_over_600_lines():
    big = {
        str(p.relative_to(REPO)): n
        for p in _modules("megatron", "orchestration", "pipeweaver")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert not big, big


def test_tools_do_not_change_sys_path():
    hits = [str(p.relative_to(REPO)) for p in _modules("tools") if "sys.path" in p.read_text()]
    assert not hits, hits


def test_code_cites_the_repository_never_a_path_outside_it():
    outside = ("shared/research", "shared/workloads", "shared/design", "research/")
    hits = [
        f"{p.relative_to(REPO)}: {needle}"
        for p in _modules(*PACKAGES, "tools", "scripts")
        for needle in outside
        if needle in p.read_text()
    ]
    assert not hits, hits
