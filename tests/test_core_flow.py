"""The rewrite core's data flows one way: type_attrs -> painter -> cast_planner -> report ->
rewriter. Each stage may import the stages before it (and config, lists), never one after it,
so any stage can be read, tested and replaced knowing only what comes before it.

Checked on the source (every import statement, function-local ones included), so the rule
holds for imports that only run on some paths too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tf_amp"

# stage -> the tf_amp modules it must not import (the stages after it, and the layers above)
LATER: dict[str, tuple[str, ...]] = {
    "type_attrs": (
        "tf_amp.config", "tf_amp.lists", "tf_amp.painter", "tf_amp.cast_planner",
        "tf_amp.report", "tf_amp.rewriter",
    ),
    "painter": ("tf_amp.cast_planner", "tf_amp.report", "tf_amp.rewriter"),
    "cast_planner": ("tf_amp.report", "tf_amp.rewriter"),
    "report": ("tf_amp.cast_planner", "tf_amp.rewriter"),
}
# Layers the rewrite core never reaches into: it takes a GraphDef and returns one.
OUTSIDE_CORE = ("tf_amp.runtime", "tf_amp.optimizers", "tf_amp.enable", "keras")


def _stage_files(stage: str) -> list[Path]:
    package = PACKAGE / stage
    return sorted(package.glob("*.py")) if package.is_dir() else [PACKAGE / f"{stage}.py"]


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("stage", sorted(LATER))
def test_a_stage_imports_no_later_stage(stage: str) -> None:
    files = _stage_files(stage)
    assert files
    for path in files:
        wrong = sorted(m for m in _imported_modules(path) if _under(m, LATER[stage]))
        assert wrong == [], f"{path.relative_to(PACKAGE.parent)} imports {wrong}"


@pytest.mark.parametrize("stage", [*sorted(LATER), "rewriter"])
def test_the_core_imports_no_runtime_layer(stage: str) -> None:
    for path in _stage_files(stage):
        wrong = sorted(m for m in _imported_modules(path) if _under(m, OUTSIDE_CORE))
        assert wrong == [], f"{path.relative_to(PACKAGE.parent)} imports {wrong}"
