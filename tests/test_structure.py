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

from glam.structure import (
    GLAM,
    ROOT,
    glam_imports,
    import_graph,
    imported_modules,
    module_name,
    schema_modules,
    unit_of,
    units,
)

LAYERS = [
    ["cli", "devices", "lazy", "scaling", "skills", "structure", "threads", "trunk"],
    ["config", "outputs", "scoring"],
    ["decoding", "demos", "models", "runs", "scaling_report"],
    ["glam", "gpu_check", "llm"],
    ["policy"],
    ["envs", "scoring_bench"],
    ["ppo"],
    ["offpolicy", "probe", "teach"],
    ["baselines"],
    ["ask", "codeact", "run_config"],
    ["eval"],
    ["bc", "campaign", "compare", "demo", "oni"],
    ["couplings"],
]
"""glam's units in layers, from the bottom: a unit imports only units of lower layers
(`test_every_import_goes_down_the_layers`). Written here once; docs/architecture.md lists them
and draws them (`scripts/draw_architecture.py`). A new subpackage or top-level module gets its
row here. `config` is the core of the training run's schema and the sections, wherever their
modules live (`glam.structure.schema_modules`); `run_config` assembles the whole schema above
the couplings."""


def _import_tuples() -> list[tuple[str, str, Path, int, bool]]:
    """`glam.structure.glam_imports` as tuples: (from unit, to unit, file, line, inside a def)."""
    return [(i.source, i.target, i.path, i.line, i.in_function) for i in glam_imports()]


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


def test_cycle_finder_finds_a_cycle_and_accepts_a_dag() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_is_read_from_the_source() -> None:
    """The graph sees the edges everybody knows are there (a broken reader finds no cycle)."""
    edges, _ = import_graph()
    assert {"config", "models", "policy"} <= edges["ppo"]
    assert "policy" in edges["eval"]


def test_subpackages_import_each_other_without_cycles() -> None:
    edges, sites = import_graph()
    cycle = _find_cycle(edges)
    if cycle is not None:
        hops = [
            f"  {a} -> {b}: {', '.join(sites[a, b])}"
            for a, b in zip(cycle, cycle[1:], strict=False)
        ]
        pytest.fail("import cycle " + " -> ".join(cycle) + "\n" + "\n".join(hops))


def _layer_of() -> dict[str, int]:
    return {unit: row for row, layer in enumerate(LAYERS) for unit in layer}


def test_every_unit_has_one_layer() -> None:
    """Every subpackage and top-level module stands in exactly one row of `LAYERS`
    and no row names a unit that is gone."""
    placed = [unit for layer in LAYERS for unit in layer]
    assert len(placed) == len(set(placed)), "a unit stands in two layers"
    present = set(units()) | {"glam"}
    assert set(placed) == present, (
        f"not in LAYERS: {sorted(present - set(placed))}; gone: {sorted(set(placed) - present)}"
    )


def _upward(edges: dict[str, set[str]], layer: dict[str, int]) -> list[tuple[str, str]]:
    """The edges that do not go to a lower layer."""
    return [
        (source, target)
        for source, targets in sorted(edges.items())
        for target in sorted(targets)
        if layer[target] >= layer[source]
    ]


def test_every_import_goes_down_the_layers() -> None:
    """No unit imports one of its own layer or a higher one: the layout reads top-down, and a
    change to a unit can only break the units above it."""
    layer = _layer_of()
    edges, sites = import_graph()
    upward = [
        f"  {source} (layer {layer[source]}) -> {target} (layer {layer[target]}): "
        + ", ".join(sites[source, target])
        for source, target in _upward(edges, layer)
    ]
    assert not upward, "imports that do not go down LAYERS:\n" + "\n".join(upward)


def test_the_layer_check_finds_imports_up_and_across() -> None:
    layer = {"low": 0, "mid": 1, "side": 1, "top": 2}
    edges = {"top": {"mid", "low"}, "mid": {"low", "side"}, "low": {"top"}}
    assert _upward(edges, layer) == [("low", "top"), ("mid", "side")]


def test_the_architecture_page_lists_the_layers() -> None:
    """docs/architecture.md's table of layers is `LAYERS`, row for row."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    rows = {}
    for line in page.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[0].isdigit():
            rows[int(cells[0])] = sorted(unit.strip("` ") for unit in cells[1].split(","))
    assert rows == dict(enumerate(LAYERS)), "docs/architecture.md's layers differ from LAYERS"


def test_evaluation_does_not_import_the_trainers() -> None:
    """Evaluation finds a run's policy with `glam.runs.folder` and plays episodes with `glam.envs`:
    no module of glam/eval imports glam.ppo (`import glam.ppo...`, `from glam.ppo... import`,
    `from glam import ppo`), so a change inside the trainer cannot break evaluation."""
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for source, target, path, line, _ in _import_tuples()
        if source == "eval" and target == "ppo"
    ]
    assert not found, "glam/eval imports glam.ppo:\n" + "\n".join(found)


def test_run_folders_do_not_import_the_trainers() -> None:
    """`glam.runs` (run folders, checkpoints, resume) serves every trainer and evaluation: it
    imports none of them, nor evaluation."""
    found = [
        f"{path.relative_to(ROOT)}:{line} imports glam.{target}"
        for source, target, path, line, _ in _import_tuples()
        if source == "runs" and target in {"ppo", "baselines", "eval", "bc"}
    ]
    assert not found, "glam/runs imports a trainer:\n" + "\n".join(found)


def test_the_training_schema_imports_only_itself() -> None:
    """The modules of the training run's schema (`schema_modules()`) import no glam module but
    each other and `glam.cli` (which imports none): counting a package's section module in the
    unit `config` hides no dependency of it on its package's code."""
    assert {
        "glam.teach.config",
        "glam.ppo.algorithm_config",
    } <= schema_modules()  # the reader works
    outside = []
    for module in sorted(schema_modules()):
        path = ROOT / (module.replace(".", "/") + ".py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                outside += [
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
                    for name in imported_modules(node, module, is_package=False)
                    if unit_of(name) is not None and name not in schema_modules() | {"glam.cli"}
                ]
    assert not outside, "the training schema imports other glam modules:\n" + "\n".join(outside)


def test_glam_modules_are_imported_at_the_top_of_modules() -> None:
    """A glam import inside a function is how a cycle hides; heavy optional dependencies
    (deepspeed, wandb, matplotlib) may still be imported late, glam's own modules may not."""
    late = [
        f"{path.relative_to(ROOT)}:{line} imports glam.{target}"
        for _, target, path, line, in_function in _import_tuples()
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


@pytest.mark.parametrize(
    "module", ["glam.ppo.entry", "glam.eval.harness", "glam.baselines.drrn_trainer", "glam.envs"]
)
def test_training_and_evaluation_do_not_import_datasets(module: str) -> None:
    """`datasets` (0.8 s) is imported where demonstrations are read or written, not by every
    training or evaluation process that might write its rollouts."""
    result = _imports_none_of(module, {"datasets"})
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
    "GenerationConfig": "reads generation_config.json only (transformers' GenerationConfig "
    "takes no trust_remote_code)",
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
    "glam.ppo": ["glam.ppo.hooks", "glam.ppo.setup", "glam.ppo.hooks"],
}
"""Circles between the modules of one package that are still there: the hooks' type of the
trainer's state (`glam.ppo.hooks` <-> `glam.ppo.setup`, under TYPE_CHECKING)."""


def _module_graph() -> dict[str, dict[str, set[str]]]:
    """Per package, its modules' imports of each other (every import, TYPE_CHECKING ones too)."""
    modules = {module_name(path) for path in GLAM.rglob("*.py")}
    graphs: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted(GLAM.rglob("*.py")):
        module = module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in imported_modules(node, module, path.name == "__init__.py"):
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
