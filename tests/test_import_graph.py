"""tf_amp's modules form a stack: every import points down, none forms a cycle.

The graph is drawn from the source (``ast``), function-local imports included (they were where
the old cycles hid), and the lazy ``sys.modules["tf_amp...."]`` look-ups too; imports under
``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "tf_amp"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imported_modules(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module of ``known`` that ``module`` imports, at any depth. ``from a import b``
    is an edge to ``a.b`` when that is a module, else to ``a`` (``b`` is defined in ``a``)."""
    found: set[str] = set()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in known else base)
        elif isinstance(node, ast.Constant) and str(node.value).startswith("tf_amp."):
            # sys.modules["tf_amp.x"] look-ups and the package's lazy export table (not
            # "tf_amp" alone: that is the logger's name)
            found.add(node.value)
        stack.extend(ast.iter_child_nodes(node))
    return {name for name in found if name in known and name != module}


def import_graph() -> dict[str, set[str]]:
    """``module -> modules of tf_amp it imports``."""
    modules = _modules()
    known = set(modules)
    return {
        name: _imported_modules(
            ast.parse(path.read_text(encoding="utf-8")), name, path.name == "__init__.py", known
        )
        for name, path in modules.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_graph_sees_function_local_and_lazy_imports() -> None:
    graph = import_graph()
    # function-local: the Keras wrapper's from_config turns the rewrite switch on
    assert "tf_amp.runtime.rewrite_switch" in graph["tf_amp.optimizers.keras"]
    # sys.modules look-up: deactivation resets the custom-loop loss-scale state
    assert "tf_amp.runtime.auto_loss_scale" in graph["tf_amp.runtime.activation"]
    # the package's lazy exports
    assert "tf_amp.enable" in graph["tf_amp"]


def test_a_cycle_is_found_when_there_is_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_tf_amp_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


@pytest.mark.parametrize(
    "bottom", ["tf_amp._flags", "tf_amp.runtime._state", "tf_amp.runtime._patches",
               "tf_amp.runtime._post_import"]
)
def test_the_bottom_of_the_runtime_imports_nothing_of_tf_amp(bottom: str) -> None:
    assert import_graph()[bottom] <= {"tf_amp", "tf_amp.runtime"}, import_graph()[bottom]


def test_private_upstream_symbols_are_imported_only_through_tf_amp_upstream() -> None:
    """``tensorflow.python.*`` and ``keras.src.*`` appear in import statements of
    ``tf_amp/_upstream`` only (the test references live in tests/, outside the package)."""
    offenders = []
    for name, path in _modules().items():
        if name.startswith("tf_amp._upstream"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module or ""]
            else:
                continue
            offenders += [
                f"{name}: {i}" for i in imported
                if i.startswith(("tensorflow.python", "keras.src"))
            ]
    assert not offenders, offenders


def test_the_startup_layer_imports_without_tensorflow() -> None:
    """The switches' state, the registry, the settings and the activation load in a fresh
    interpreter where TensorFlow and Keras cannot be imported at all: the startup hook must
    cost nothing, and each of these modules imports alone."""
    modules = ["tf_amp._upstream.versions", "tf_amp.runtime._state", "tf_amp.runtime._patches",
               "tf_amp.runtime._post_import", "tf_amp.runtime.settings",
               "tf_amp.runtime.activation", "tf_amp.runtime.autoenable"]
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorflow', 'keras'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    env = {"PATH": "/usr/bin:/bin"}  # no TF_ENABLE_AUTO_MIXED_PRECISION*: nothing activates
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=PACKAGE_ROOT.parent, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
