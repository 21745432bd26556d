"""The layout: glam's subpackages depend on each other one way, and import each other at the top.

The import graph is read from the source with `ast` (no module is imported), counting every
import, including those inside functions: an import moved into a function still couples two
subpackages, it only hides a cycle until the function runs.

.venv/bin/python -m pytest tests/test_structure.py
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GLAM = ROOT / "glam"
UNITS = sorted(
    path.stem if path.is_file() else path.name
    for path in GLAM.iterdir()
    if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
)
"""glam's subpackages (`ppo`, `eval`, ...) and top-level modules (`config`, `scoring`, ...)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _unit(module: str) -> str | None:
    """`glam.ppo.trainer` -> `ppo`; `glam` itself -> `glam`; outside glam -> None."""
    parts = module.split(".")
    if parts[0] != "glam":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in UNITS else "glam"


def _imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list:
    """Absolute names of the modules an import statement loads (`from glam import x`: glam.x)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: resolve against the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1])
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
    return [source] + [f"{source}.{alias.name}" for alias in node.names if source == "glam"]


def _glam_imports() -> list[tuple[str, str, Path, int, bool]]:
    """Every import of a glam module in glam/: (from unit, to unit, file, line, inside a def)."""
    found = []
    for path in sorted(GLAM.rglob("*.py")):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        in_function = {
            id(inner)
            for outer in ast.walk(tree)
            if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for inner in ast.walk(outer)
        }
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_modules(node, module, path.name == "__init__.py"):
                target = _unit(name)
                if target is not None:
                    found.append(
                        (_unit(module), target, path, node.lineno, id(node) in in_function)
                    )
    return found


def _find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as `[a, b, ..., a]`, or None (depth-first search, three colours)."""
    state: dict[str, int] = defaultdict(int)  # 0 unseen, 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(edges[node]):
            if state[successor] == 1:
                return path[path.index(successor) :] + [successor]
            if state[successor] == 0 and (cycle := visit(successor)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if state[node] == 0 and (cycle := visit(node)):
            return cycle
    return None


def _graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    edges: dict[str, set[str]] = defaultdict(set)
    sites: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, target, path, line, _ in _glam_imports():
        if source != target:
            edges[source].add(target)
            sites[source, target].append(f"{path.relative_to(ROOT)}:{line}")
    return edges, sites


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_is_read_from_the_source() -> None:
    """The graph sees the edges everybody knows are there (a broken reader finds no cycle)."""
    edges, _ = _graph()
    assert {"config", "models", "policy"} <= edges["ppo"]
    assert "policy" in edges["eval"]


def test_subpackages_import_each_other_without_cycles() -> None:
    edges, sites = _graph()
    cycle = _find_cycle(edges)
    if cycle is not None:
        hops = [
            f"  {a} -> {b}: {', '.join(sites[a, b])}"
            for a, b in zip(cycle, cycle[1:], strict=False)
        ]
        pytest.fail("import cycle " + " -> ".join(cycle) + "\n" + "\n".join(hops))


def test_glam_modules_are_imported_at_the_top_of_modules() -> None:
    """A glam import inside a function is how a cycle hides; heavy optional dependencies
    (deepspeed, wandb, matplotlib) may still be imported late, glam's own modules may not."""
    late = [
        f"{path.relative_to(ROOT)}:{line} imports glam.{target}"
        for _, target, path, line, in_function in _glam_imports()
        if in_function
    ]
    assert not late, "imports of glam inside functions:\n" + "\n".join(late)


def _imports_none_of(module: str, heavy: set[str]) -> subprocess.CompletedProcess[str]:
    code = (
        f"import sys, {module}\n"
        f"heavy = sorted(set({sorted(heavy)!r}) & set(sys.modules))\n"
        "assert not heavy, heavy"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "module", ["glam", "glam.config", "glam.campaign", "glam.llm.config", "glam.compare"]
)
def test_light_modules_do_not_import_torch(module: str) -> None:
    """Configs, campaigns and run comparisons are read in a fraction of a second, without torch
    or transformers: `glam`'s own names (`glam.load_model`, ...) load when first used."""
    result = _imports_none_of(module, {"torch", "transformers"})
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("module", ["glam.baselines.symbolic", "glam.eval.agents", "glam.policy"])
def test_small_policies_do_not_import_the_language_model_stack(module: str) -> None:
    """The symbolic policy and the evaluation's agents need torch, not transformers or peft
    (seconds of import in every evaluation of a small policy)."""
    result = _imports_none_of(module, {"transformers", "peft"})
    assert result.returncode == 0, result.stderr


def test_lazy_top_level_names_load_on_first_use() -> None:
    import glam
    from glam.models import loading

    assert glam.load_model is loading.load_model
    assert glam.DEFAULT_MODEL in glam.EMBEDDED_MODELS
    assert set(glam.__all__) <= set(dir(glam))
    with pytest.raises(AttributeError, match="no_such_name"):
        glam.no_such_name  # noqa: B018
