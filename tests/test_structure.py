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


def _declares_a_section(path: Path) -> bool:
    """Whether the module declares a section of the training run (`@config_section(...)`)."""
    return any(
        isinstance(decorator, ast.Call) and getattr(decorator.func, "id", None) == "config_section"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.ClassDef)
        for decorator in node.decorator_list
    )


SCHEMA_MODULES = {"glam.config", "glam.run_config"} | {
    _module_name(path) for path in sorted(GLAM.rglob("*.py")) if _declares_a_section(path)
}
"""The training run's schema: its core (`glam.config`), its assembly (`glam.run_config`) and the
section each coupling and algorithm declares in its own package (`glam.teach.config`...). They
count as one unit, `config`, wherever they live: the bottom layer, which imports only itself
(`test_the_training_schema_imports_only_itself`), so that every package may import the schema."""


def _unit(module: str) -> str | None:
    """`glam.ppo.trainer` -> `ppo`; `glam` itself -> `glam`; outside glam -> None; a module of
    the training run's schema (`glam.teach.config`) -> `config`."""
    parts = module.split(".")
    if parts[0] != "glam":
        return None
    if module in SCHEMA_MODULES:
        return "config"
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


def test_evaluation_does_not_import_the_trainers() -> None:
    """Evaluation finds a run's policy with `glam.runs.folder` and plays episodes with `glam.envs`:
    no module of glam/eval imports glam.ppo (`import glam.ppo...`, `from glam.ppo... import`,
    `from glam import ppo`), so a change inside the trainer cannot break evaluation."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for source, target, path, line, _ in _glam_imports()
        if source == "eval" and target == "ppo"
    ]
    assert not found, "glam/eval imports glam.ppo:\n" + "\n".join(found)


def test_run_folders_do_not_import_the_trainers() -> None:
    """`glam.runs` (run folders, checkpoints, resume) serves every trainer and evaluation: it
    imports none of them, nor evaluation."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports glam.{target}"
        for source, target, path, line, _ in _glam_imports()
        if source == "runs" and target in {"ppo", "baselines", "eval", "bc"}
    ]
    assert not found, "glam/runs imports a trainer:\n" + "\n".join(found)


def test_the_training_schema_imports_only_itself() -> None:
    """The modules of the training run's schema (`SCHEMA_MODULES`) import no glam module but
    each other and `glam.cli` (which imports none): counting a package's section module in the
    unit `config` hides no dependency of it on its package's code."""
    assert {"glam.teach.config", "glam.ppo.algorithm_config"} <= SCHEMA_MODULES  # the reader works
    outside = []
    for module in sorted(SCHEMA_MODULES):
        path = ROOT / (module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                outside += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                    for name in _imported_modules(node, module, is_package=False)
                    if _unit(name) is not None and name not in SCHEMA_MODULES | {"glam.cli"}
                ]
    assert not outside, "the training schema imports other glam modules:\n" + "\n".join(outside)


def test_glam_modules_are_imported_at_the_top_of_modules() -> None:
    """A glam import inside a function is how a cycle hides; heavy optional dependencies
    (deepspeed, wandb, matplotlib) may still be imported late, glam's own modules may not. One
    exception inside the schema's own layer: `glam.config.compose_config` defaults to the
    training run's schema, `glam.run_config`, which imports `glam.config`."""
    late = [
        f"{path.relative_to(ROOT)}:{line} imports glam.{target}"
        for _, target, path, line, in_function in _glam_imports()
        if in_function and not (path == GLAM / "config.py" and target == "config")
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
    "module",
    [
        "glam",
        "glam.config",
        "glam.run_config",
        "glam.campaign",
        "glam.llm.config",
        "glam.compare",
        "glam.runs",
        "glam.runs.folder",
        "glam.runs.errors",
    ],
)
def test_light_modules_do_not_import_torch(module: str) -> None:
    """Configs, campaigns, run comparisons and a run's checkpoints are read in a fraction of a
    second, without torch or transformers: `glam`'s own names (`glam.load_model`, ...) load when
    first used."""
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


# --------------------------------------------------------------------------------------------
# Model code runs only when the user says so
# --------------------------------------------------------------------------------------------

_LOADERS = ("from_pretrained", "from_config")
"""Methods through which transformers may import a `.py` file a folder's `auto_map` names (and,
without a `trust_remote_code`, ask "run custom code? [y/N]" on a terminal and run it on "y")."""
_RUNS_NO_MODEL_CODE = {
    "PeftModel": "peft reads adapter_config.json and the adapter weights onto a loaded model",
    "SymbolicActorCritic": "glam's own network: glam_policy.json and safetensors",
    "DRRNPolicy": "glam's own network: glam_policy.json and safetensors",
    "policy_class": "glam.baselines.loading's call for the symbolic and DRRN policies (the "
    "language model's call, beside it, passes trust_remote_code)",
}
"""Receivers of a loader call that load no model code, and why."""
_OFF_BY_DEFAULT = {"LLMActorCritic"}
"""glam's own loaders whose `trust_remote_code` is False unless given (checked below)."""


def _loader_calls() -> list[tuple[str, str, bool]]:
    """Every `X.from_pretrained(...)` / `X.from_config(...)` in glam/ and scripts/: (receiver,
    `file:line`, whether it passes `trust_remote_code=` by name)."""
    calls = []
    for path in sorted([*GLAM.rglob("*.py"), *(ROOT / "scripts").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LOADERS
            ):
                named = any(keyword.arg == "trust_remote_code" for keyword in node.keywords)
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                calls.append((ast.unparse(node.func.value), where, named))
    return calls


def _default_of(path: Path, function: str, argument: str) -> object:
    """The default value of `argument` of the `function` defined in `path` (read, not run)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            args = node.args
            positional = args.posonlyargs + args.args
            tail = positional[len(positional) - len(args.defaults) :]
            pairs = list(zip(tail, args.defaults, strict=True))
            pairs += [
                (a, d)
                for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                if d is not None
            ]
            for arg, default in pairs:
                if arg.arg == argument:
                    return ast.literal_eval(default)
    raise AssertionError(f"{path}: no {function}({argument}=...)")


def test_every_model_and_tokenizer_load_says_whether_model_code_may_run() -> None:
    """`trust_remote_code` is passed by name at every transformers load (a BC folder's or a
    .gguf file's tokenizer_config.json that auto_maps a .py file once ran it on a "y"); a new
    call that forgets it fails here."""
    calls = _loader_calls()
    receivers = {receiver for receiver, _, _ in calls}
    assert {"AutoTokenizer", "AutoConfig", "AutoModelForCausalLM"} <= receivers  # the reader works
    silent = [
        f"{where}: {receiver}.from_...(...) without trust_remote_code="
        for receiver, where, named in calls
        if not named and receiver not in _RUNS_NO_MODEL_CODE and receiver not in _OFF_BY_DEFAULT
    ]
    assert not silent, "loads that leave model code to transformers' prompt:\n" + "\n".join(silent)
    # glam's own loaders called without it default to False, never to the folder's say.
    policy = GLAM / "policy" / "llm_policy.py"
    assert _default_of(policy, "from_pretrained", "trust_remote_code") is False
    assert _default_of(GLAM / "models" / "loading.py", "load_model", "trust_remote_code") is False
    config = ast.parse((GLAM / "config.py").read_text())
    (model_config,) = [
        node
        for node in ast.walk(config)
        if isinstance(node, ast.ClassDef) and node.name == "ModelConfig"
    ]
    (field,) = [
        node
        for node in model_config.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "trust_remote_code"
    ]
    assert ast.literal_eval(field.value) is False  # what LLMActorCritic.from_config reads


# --------------------------------------------------------------------------------------------
# One error format for every script
# --------------------------------------------------------------------------------------------

_OWN_STDERR: dict[str, str] = {}
"""Scripts allowed to print their errors themselves, with the reason (none today)."""


def test_scripts_report_bad_input_through_one_function() -> None:
    """Every script prints its errors with `glam.cli` (`error: MESSAGE`, exit 2; 1 for a bad
    config), never with a `print(..., file=sys.stderr)` of its own, nor argparse's `prog:
    error:` for anything but the command line's own syntax."""
    own = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        if path.name in _OWN_STDERR:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "print"
                and any(k.arg == "file" and "stderr" in ast.unparse(k.value) for k in node.keywords)
            ):
                own.append(f"scripts/{path.name}:{node.lineno}")
    assert not own, "scripts printing errors themselves (use glam.cli):\n" + "\n".join(own)


KNOWN_MODULE_CIRCLES = {
    "glam": ["glam.config", "glam.run_config", "glam.config"],
    "glam.ppo": ["glam.ppo.hooks", "glam.ppo.trainer", "glam.ppo.hooks"],
}
"""Circles between the modules of one package that are still there: the run's schema, whose
composition sits in the lowest module (`glam.config` <-> `glam.run_config`), and the hooks'
type of the trainer's state (`glam.ppo.hooks` <-> `glam.ppo.trainer`, under TYPE_CHECKING)."""


def _module_graph() -> dict[str, dict[str, set[str]]]:
    """Per package, its modules' imports of each other (every import, TYPE_CHECKING ones too)."""
    modules = {_module_name(path) for path in GLAM.rglob("*.py")}
    graphs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(GLAM.rglob("*.py")):
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_modules(node, module, path.name == "__init__.py"):
                while name and name not in modules:
                    name = name.rpartition(".")[0]
                if name and name != package and name.rpartition(".")[0] == package != module:
                    graphs[package][module].add(name)
    return graphs


def test_the_modules_of_a_package_import_each_other_without_circles() -> None:
    """The evaluation's episodes and journal no longer import each other; the circles left are
    listed, and the list must stay true (a new circle fails, and so does a fixed one still
    listed)."""
    found = {
        package: cycle
        for package, edges in _module_graph().items()
        if (cycle := _find_cycle(defaultdict(set, edges)))
    }
    assert found == KNOWN_MODULE_CIRCLES
