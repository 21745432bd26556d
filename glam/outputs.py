"""Output folders and files: what each script writes, and the one check every script runs on its
folder before any work.

A script that finds out only after its episodes, its training or its model load that it cannot
write its results loses them; one that writes wherever it is told can replace a training run's
checkpoints with a dataset. So every script that writes into a folder calls `check_output_dir`
first, with the `OutputKind` it writes. The check refuses, naming the folder and the way out:

- a path that is a file, or below a file, or a folder that cannot be written (tried for real:
  a temporary file is created and removed);
- a folder holding another kind of output (a training run, an evaluation, a dataset...), even
  with the script's overwrite option: overwrite replaces a script's own earlier output, never
  another's;
- a folder holding this kind of output already, unless overwrite is on;
- for the kinds that own their folder (a demonstrations dataset, a BC policy), a folder that is
  not empty and holds none of their files: a dataset replaces the whole folder, a BC policy writes
  a model's files into it.

Output files (a plot, a JSON report: `check_output_file`) follow the same rule: never one of an
output folder's own files (a run's `metrics.csv`), and a file that exists is replaced only when
the same script wrote it (its mark: `written_by`, `png_metadata`) or under the script's
`--overwrite`; checked before any work. `write_json` writes such a file, marked.

Torch-free: the training, evaluation, dataset and plotting scripts all import it.
"""

from __future__ import annotations

import fnmatch
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glam.cli import describe_os_error

__all__ = [
    "AGREEMENT",
    "BC_POLICY",
    "COMPARISON",
    "DEMOS",
    "EPISODES_JSONL",
    "EVALUATION",
    "IMITATION",
    "KINDS",
    "SUMMARY",
    "TRAINING_RUN",
    "OutputDirError",
    "OutputExistsError",
    "OutputKind",
    "PLOT_SUFFIXES",
    "check_output_dir",
    "WRITTEN_BY",
    "add_output_file_options",
    "check_output_file",
    "mark",
    "png_metadata",
    "write_json",
    "written_by",
]


class OutputDirError(ValueError):
    """An output folder a script cannot or must not write into; the message says why and what
    to do instead."""


class OutputExistsError(OutputDirError, FileExistsError):
    """The output folder already holds this script's kind of output and overwriting is off."""


@dataclass(frozen=True)
class OutputKind:
    """One kind of output folder: what writes it and which files show that a folder holds it."""

    name: str
    """What the writer's own refusal says the folder already holds (`a run`, `results`); other
    writers name the kind by its key in `KINDS` (`a training run`)."""
    files: tuple[str, ...]
    """Names (or `fnmatch` patterns) of what the writer puts in the folder."""
    signature: tuple[str, ...] = ()
    """The files that mark a folder as this kind for the other writers (default: `files`);
    narrower where a name is shared (a BC policy writes a `config.yaml` too)."""
    owns_folder: bool = False
    """Written only into a new or empty folder, or one holding this kind already."""
    replaces_folder: bool = False
    """Overwriting replaces the whole folder: a folder with other files too is refused."""

    @property
    def marks(self) -> tuple[str, ...]:
        """The files that tell the other writers a folder holds this kind."""
        return self.signature or self.files

    def found(self, folder: Path, names: tuple[str, ...] | None = None) -> list[str]:
        """Which of `names` (default: `files`) the folder holds, in the order given (for a
        pattern, the first file it matches)."""
        entries = sorted(entry.name for entry in folder.iterdir())
        held = []
        for pattern in self.files if names is None else names:
            matches = [entry for entry in entries if fnmatch.fnmatchcase(entry, pattern)]
            if matches:
                held.append(matches[0])
        return held


TRAINING_RUN = OutputKind(
    "a run", ("config.yaml", "metrics.csv", "checkpoints"), signature=("checkpoints", "metrics.csv")
)
"""`scripts/train_language_agent.py`, `scripts/train_baseline.py` (`train.output_dir`)."""
EPISODES_JSONL = "episodes.jsonl"
"""An evaluation's episodes, one JSON line each (`glam.eval.harness`, read by `glam.compare` and
`glam.eval.paired`)."""
EVALUATION = OutputKind(
    "results",
    ("results.json", "results.csv", "results.md", "results.png", EPISODES_JSONL),
)
"""`scripts/post_training_tests.py`, `scripts/zero_shot_generation.py` (`eval.output_dir`), in
the order `glam.eval.harness.evaluate` writes them."""
SUMMARY = OutputKind("results", ("summary.md", "summary.csv", "summary.png"))
"""`scripts/test_results.py` (`output_dir`)."""
COMPARISON = OutputKind(
    "results", ("comparison.csv", "final.csv", "comparison.md", "comparison.png")
)
"""`scripts/compare_runs.py` (`--out`)."""
DEMOS = OutputKind(
    "a demonstrations dataset",
    # cache-*.arrow: what `datasets` wrote beside a dataset that was mapped in place (BC did so
    # before it read its dataset into memory): the dataset's own, replaced with it
    ("dataset_info.json", "state.json", "data-*.arrow", "cache-*.arrow"),
    signature=("dataset_info.json", "state.json"),
    owns_folder=True,
    replaces_folder=True,
)
"""`scripts/collect_bot_demos.py` (`demos.output_dir`): a `datasets` folder, replaced whole."""
BC_POLICY = OutputKind(
    "results",
    (
        "bc_policy.json",
        "metrics.json",
        "config.yaml",
        "adapter_config.json",
        "adapter_model.safetensors",
        "config.json",
        "model.safetensors",
    ),
    signature=("bc_policy.json",),
    owns_folder=True,
)
"""`scripts/clm_behavioral_cloning.py` (`bc.output_dir`): a model's files and `bc_policy.json`."""
CLONED_POLICY = OutputKind(
    "results",
    ("clone.json", "clone.csv", "config.yaml", "policy", "checkpoint"),
    signature=("clone.json",),
    owns_folder=True,
)
"""`scripts/clone_policy.py` (`clone.output_dir`): a policy folder and the run's figures."""
AGREEMENT = OutputKind(
    "results", ("agreement.json", "agreement.md", "situations.jsonl", "messages.jsonl")
)
"""`scripts/teacher_agreement.py`, `scripts/oni_label_agreement.py`, `scripts/bot_agreement.py`."""
IMITATION = OutputKind("results", ("imitation.csv", "imitation.json", "imitation.md"))
"""`scripts/imitate_bot.py`."""

KINDS: dict[str, OutputKind] = {
    "a training run": TRAINING_RUN,
    "an evaluation": EVALUATION,
    "a results summary": SUMMARY,
    "a comparison of runs": COMPARISON,
    "a demonstrations dataset": DEMOS,
    "a BC policy": BC_POLICY,
    "a cloned policy": CLONED_POLICY,
    "agreement tables": AGREEMENT,
    "a bot imitation": IMITATION,
}
"""Every kind of output folder, by the name other writers' messages give it."""


def check_output_dir(
    folder: str | Path,
    kind: OutputKind,
    *,
    key: str,
    overwrite: bool,
    overwrite_key: str,
    again: str = "replace them",
) -> Path:
    """Check that `kind` may be written into `folder` (see the module docstring); return it.
    The folder is not created: the caller does, when it writes.

    Args:
        folder: the output folder.
        kind: what the caller writes there.
        key: the option that named the folder (`eval.output_dir`, `--out`), for messages.
        overwrite: whether the caller may replace its own earlier output there.
        overwrite_key: the option that allows it (`eval.overwrite`, `train.resume`, or a flag:
            `--overwrite`), for messages.
        again: what `overwrite_key` does, for messages (`replace them`, `continue it`).

    Raises:
        OutputExistsError: the folder holds this kind already and `overwrite` is false.
        OutputDirError: any other reason not to write there.
    """
    path = Path(folder).expanduser()
    where = f"{key}={str(folder)!r}"
    if path.is_dir():
        _check_contents(path, kind, where, key, overwrite, overwrite_key, again)
    elif path.exists() or path.is_symlink():
        raise OutputDirError(f"{where} is a file, not a folder: choose another {key}")
    _check_writable(path, where, key)
    return path


PLOT_SUFFIXES: tuple[str, ...] = (".png", ".pdf", ".svg")
"""The files a plotting script writes (matplotlib's format by the ending; only a PNG carries its
writer's mark, so a PDF or SVG that exists is replaced only with `--overwrite`)."""
WRITTEN_BY = "written_by"
"""The key of a JSON output file (and the PNG text field `Software`, as `glam <writer>`) that
names the script that wrote it: `check_output_file` replaces a file only when its own writer's
name is there."""


def check_output_file(
    path: str | Path,
    *,
    key: str,
    writer: str,
    overwrite: bool = False,
    overwrite_key: str = "--overwrite",
    suffixes: tuple[str, ...] = (),
) -> Path:
    """Check, before any work, that `writer` may write the file `path` (a plot, a JSON report);
    return it. The rule of output folders, for a file:

    - not a folder, and its folder (or the nearest existing parent) writable;
    - never one of an output folder's own files (a training run's `metrics.csv` or
      `config.yaml`, an evaluation's `results.json`...), even with `overwrite`;
    - a file that exists is replaced only when `writer` wrote it (`written_by`: the JSON key
      `written_by`, or a PNG's `Software` field) or with `overwrite`.

    Args:
        path: the file.
        key: the option that named it (`--out`), for messages.
        writer: the script that writes it (`scripts/bench_ppo.py`), as `mark` records it.
        overwrite: replace a file that exists whoever wrote it (not an output folder's file).
        overwrite_key: the option that allows it, for messages.
        suffixes: the file endings the writer can write (`PLOT_SUFFIXES`); empty: any.

    Raises:
        OutputDirError: naming the problem and the way out.
    """
    path = Path(path).expanduser()
    where = f"{key}={str(path)!r}"
    if path.is_dir():
        raise OutputDirError(f"{where} is a folder: name a file")
    if suffixes and path.suffix.lower() not in suffixes:
        raise OutputDirError(f"{where}: name a file ending in {' or '.join(suffixes)}")
    if path.parent.is_dir():
        for name, kind in KINDS.items():
            owned = any(fnmatch.fnmatchcase(path.name, pattern) for pattern in kind.files)
            if owned and kind.found(path.parent, kind.marks):
                raise OutputDirError(
                    f"{where} is a file of {name} ({path.parent}), which no other script "
                    f"replaces: choose another {key}"
                )
    if path.exists() or path.is_symlink():
        found = written_by(path)
        if found != writer and not overwrite:
            author = f"{found} wrote it" if found else "not written by this script"
            raise OutputDirError(
                f"{where} exists ({author}): pass {_given(overwrite_key)} to replace it, or "
                f"choose another {key}"
            )
    _check_writable(path.parent, where, key)
    return path


def add_output_file_options(parser: Any, flag: str = "--out", help: str = "") -> None:
    """Add `flag` (an output file, `Path`) and `--overwrite` (replace it even when another
    script wrote it) to an `argparse` parser."""
    parser.add_argument(
        flag, type=Path, default=None, help=help or "write the results as JSON here"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace {flag} even if another script wrote it (never a run's or an evaluation's file)",
    )


def mark(record: dict, writer: str) -> dict:
    """`record` with `written_by: writer` first: what `check_output_file` recognises again."""
    return {WRITTEN_BY: writer} | {k: v for k, v in record.items() if k != WRITTEN_BY}


def png_metadata(writer: str) -> dict[str, str]:
    """`savefig(..., metadata=png_metadata(writer))`: the PNG's mark of its writer."""
    return {"Software": f"glam {writer}"}


def write_json(path: str | Path, record: dict, writer: str) -> Path:
    """Write `record`, marked as `writer`'s (`mark`), to the JSON file `path` (its folder
    created), through a temporary file renamed over it: a crash leaves the old file or the new
    one, never half of one. Check the path first with `check_output_file`. Returns the path."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(mark(record, writer), indent=2, default=str) + "\n")
    partial.replace(path)
    return path


def written_by(path: str | Path) -> str | None:
    """The script that wrote the file `path` by its mark (`mark`, `png_metadata`), or None: an
    unreadable file, another format, or no mark."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".png":
            from PIL import Image  # matplotlib's own dependency; only plots need it

            with Image.open(path) as image:
                software = str(getattr(image, "text", {}).get("Software", ""))
            return software.removeprefix("glam ") if software.startswith("glam ") else None
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, SyntaxError):
        return None
    found = record.get(WRITTEN_BY) if isinstance(record, dict) else None
    return found if isinstance(found, str) else None


def _check_contents(
    path: Path,
    kind: OutputKind,
    where: str,
    key: str,
    overwrite: bool,
    overwrite_key: str,
    again: str,
) -> None:
    for name, other in KINDS.items():
        if other is kind:
            continue
        held = other.found(path, other.marks)
        if held:
            raise OutputDirError(
                f"{where} holds {name} ({', '.join(held)}), which {_given(overwrite_key)} never "
                f"replaces: choose another {key}"
            )
    own = kind.found(path)
    if own and not overwrite:
        raise OutputExistsError(
            f"{where} already holds {kind.name} ({', '.join(own)}): pass {_given(overwrite_key)} "
            f"to {again}, or choose another {key}"
        )
    if not kind.owns_folder:
        return
    entries = sorted(entry.name for entry in path.iterdir() if not entry.name.startswith("."))
    if entries and not own:
        raise OutputDirError(
            f"{where} is not empty ({_some(entries)}) and holds no {_kind_name(kind)}: choose a "
            f"new or empty {key}"
        )
    if kind.replaces_folder:
        others = [e for e in entries if not any(fnmatch.fnmatchcase(e, p) for p in kind.files)]
        if others:
            raise OutputDirError(
                f"{where} holds other files too ({_some(others)}), which replacing the "
                f"{_kind_name(kind)} would delete: choose another {key}"
            )


def _check_writable(path: Path, where: str, key: str) -> None:
    """Create and remove a temporary file in `path`, or in its nearest existing parent folder
    when it does not exist yet (the writer creates it): permissions, a read-only or full file
    system and a file in the way show up here rather than after the work. Nothing is left
    behind, not even an empty folder, should the script stop later for another reason."""
    existing = next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())
    if not existing.is_dir():
        raise OutputDirError(
            f"{where} cannot be created: {existing} is a file, not a folder; choose another {key}"
        )
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".write-test-"):
            pass
    except OSError as error:
        raise OutputDirError(
            f"{where} is not writable ({describe_os_error(error)} in {existing}): choose "
            f"another {key}"
        ) from None


def _given(option: str) -> str:
    """How an option is switched on: `--overwrite` (a flag), `eval.overwrite=true` (Hydra)."""
    return option if option.startswith("-") else f"{option}=true"


def _kind_name(kind: OutputKind) -> str:
    return next(name for name, known in KINDS.items() if known is kind).split(" ", 1)[1]


def _some(names: list[str], shown: int = 4) -> str:
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
