"""glam's layout read from its own source: which of its packages imports which, and in what
layers they stand (docs/architecture.md; the layer order is enforced by tests/test_structure.py).

The import graph is read with `ast` (no module is imported), counting every import, including
those inside functions and under `TYPE_CHECKING`: an import moved into a function still couples
two packages, it only hides a cycle until the function runs. A *unit* is one of glam's
subpackages (`ppo`, `eval`...) or top-level modules (`scoring`, `trunk`...); the core of the
training run's schema (`glam.config`) and the section each coupling and algorithm declares in
its own package with `@config_section` count as one unit, `config`, wherever their modules live
(the schemas that assemble them stand in the layers of the code that reads them).

    python scripts/draw_architecture.py        # docs/architecture.png from this graph
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GLAM = ROOT / "glam"

__all__ = [
    "Import",
    "glam_imports",
    "import_graph",
    "longest_path_layers",
    "module_name",
    "schema_modules",
    "transitive_reduction",
    "unit_of",
    "units",
]


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of a unit on another."""

    source: str
    """The importing unit."""
    target: str
    """The imported unit."""
    path: Path
    line: int
    in_function: bool
    """Inside a function (or a lambda): it runs late."""


@cache
def units() -> tuple[str, ...]:
    """glam's subpackages (`ppo`, `eval`, ...) and top-level modules (`config`, `scoring`, ...)."""
    return tuple(
        sorted(
            path.stem if path.is_file() else path.name
            for path in GLAM.iterdir()
            if (path.suffix == ".py" and path.stem != "__init__")
            or (path / "__init__.py").is_file()
        )
    )


def module_name(path: Path) -> str:
    """`glam/ppo/trainer.py` -> `glam.ppo.trainer`; a package's `__init__.py` -> the package."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _declares_a_section(path: Path) -> bool:
    """Whether the module declares a section of the training run (`@config_section(...)`)."""
    return any(
        isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "config_section"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ClassDef)
        for decorator in node.decorator_list
    )


@cache
def schema_modules() -> frozenset[str]:
    """The training run's schema's parts: its core (`glam.config`) and the section each
    coupling and algorithm declares in its own package."""
    return frozenset({"glam.config"}) | {
        module_name(path) for path in sorted(GLAM.rglob("*.py")) if _declares_a_section(path)
    }


def unit_of(module: str) -> str | None:
    """`glam.ppo.trainer` -> `ppo`; `glam` itself -> `glam`; outside glam -> None; a module of
    the training run's schema (`glam.teach.config`) -> `config`."""
    parts = module.split(".")
    if parts[0] != "glam":
        return None
    if module in schema_modules():
        return "config"
    return parts[1] if len(parts) > 1 and parts[1] in units() else "glam"


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
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


def glam_imports() -> list[Import]:
    """Every import of a glam module in glam/, in file order."""
    found = []
    for path in sorted(GLAM.rglob("*.py")):
        module = module_name(path)
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
            for name in imported_modules(node, module, path.name == "__init__.py"):
                target = unit_of(name)
                if target is not None:
                    found.append(
                        Import(unit_of(module), target, path, node.lineno, id(node) in in_function)
                    )
    return found


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], list[str]]]:
    """The units' dependencies (`unit -> the units it imports`, itself left out) and where each
    edge's imports are (`file:line`)."""
    edges: dict[str, set[str]] = defaultdict(set)
    sites: dict[tuple[str, str], list[str]] = defaultdict(list)
    for found in glam_imports():
        if found.source != found.target:
            edges[found.source].add(found.target)
            sites[found.source, found.target].append(f"{found.path.relative_to(ROOT)}:{found.line}")
    return edges, sites


def longest_path_layers(edges: dict[str, set[str]], nodes: set[str]) -> list[list[str]]:
    """Layers from the bottom: a node with no dependency is in layer 0, any other one above the
    highest of its dependencies. Raises ValueError on a cycle."""
    level: dict[str, int] = {}
    visiting: set[str] = set()

    def height(node: str) -> int:
        if node in level:
            return level[node]
        if node in visiting:
            raise ValueError(f"a cycle through {node}")
        visiting.add(node)
        below = [height(successor) for successor in edges.get(node, ())]
        visiting.discard(node)
        level[node] = 1 + max(below) if below else 0
        return level[node]

    for node in nodes | set(edges):
        height(node)
    layers: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for node, index in level.items():
        layers[index].append(node)
    return [sorted(layer) for layer in layers]


def transitive_reduction(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The edges of an acyclic graph that no longer path implies (the ones a picture needs)."""

    @cache
    def reachable(node: str) -> frozenset[str]:
        found: set[str] = set()
        for successor in edges.get(node, ()):
            found |= {successor} | reachable(successor)
        return frozenset(found)

    return {
        node: {
            successor
            for successor in successors
            if not any(successor in reachable(other) for other in successors - {successor})
        }
        for node, successors in edges.items()
    }


def draw(
    layers: list[list[str]],
    edges: dict[str, set[str]],
    out: Path,
    metadata: dict[str, str] | None = None,
) -> None:
    """Draw the units in their layers, bottom to top, with the edges of the graph's transitive
    reduction (an arrow from a unit to one it imports), into the image `out` (its PNG
    `metadata`: the writer's mark)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where = {
        unit: (column - (len(layer) - 1) / 2, row)
        for row, layer in enumerate(layers)
        for column, unit in enumerate(layer)
    }
    widest = max(len(layer) for layer in layers)
    fig, ax = plt.subplots(figsize=(2.0 + 1.5 * widest, 1.0 + 0.75 * len(layers)))
    for source, targets in sorted(transitive_reduction(edges).items()):
        for target in sorted(targets):
            (x0, y0), (x1, y1) = where[source], where[target]
            ax.annotate(
                "",
                xy=(x1, y1 + 0.18),
                xytext=(x0, y0 - 0.18),
                arrowprops={"arrowstyle": "->", "color": "0.6", "lw": 0.8},
            )
    for unit, (x, y) in where.items():
        ax.text(
            x,
            y,
            unit,
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.3"},
        )
    for row in range(len(layers)):
        ax.text(-widest / 2 - 0.6, row, f"{row}", ha="right", va="center", color="0.4")
    ax.set_xlim(-widest / 2 - 1.0, widest / 2 + 0.5)
    ax.set_ylim(-0.6, len(layers) - 0.4)
    ax.axis("off")
    ax.set_title("glam's units in layers (an arrow: imports; implied arrows left out)")
    fig.tight_layout()
    fig.savefig(out, dpi=110, metadata=metadata)
    plt.close(fig)
