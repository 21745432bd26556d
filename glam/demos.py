"""Demonstrations as a Hugging Face dataset: the schema, a crash-safe writer and a checked loader.

One row is one decision: the prompt the policy saw (in its exact format), the action taken, and
where it came from. The bot collector (`glam.bc.bot`) and the PPO trainer (its own rollouts) both
write through :class:`DemoWriter` / :func:`write_demos`, and behavioural cloning (`glam.bc.sft`)
reads them with :func:`load_demos`, so the schema lives here only, below both `glam.ppo` and
`glam.bc`:

>>> with DemoWriter("data/demos/mine", metadata={"level": "BabyAI-GoToLocal-v0"}) as writer:
...     writer.add(DemoRecord(prompt=..., action="turn left", action_index=0, ...))  # doctest: +SKIP
>>> dataset = load_demos("data/demos/mine")  # doctest: +SKIP

The folder is written by `Dataset.save_to_disk` into a temporary sibling and renamed into place,
so an interrupted run never leaves a half-written dataset that looks complete. `datasets` is
imported by the functions that read or write one (0.8 s): a training run that never writes its
rollouts does not pay for it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import babyai_text
from glam.outputs import DEMOS, check_output_dir

if TYPE_CHECKING:
    from datasets import Dataset, Features

__all__ = [
    "DEMO_COLUMNS",
    "REQUIRED_COLUMNS",
    "DemoDatasetError",
    "DemoRecord",
    "DemoWriter",
    "ReplayedStep",
    "demo_features",
    "demo_metadata",
    "load_demos",
    "replay_demonstrations",
    "split_pairs",
    "write_demos",
]


@dataclass(frozen=True)
class DemoRecord:
    """One (prompt, action) decision of an episode."""

    prompt: str
    """The policy's prompt at this step, exactly as the scorer reads it (ends with `Action k:`)."""
    action: str
    """The action word taken (without the leading space the scorer adds)."""
    action_index: int
    """Index of `action` in the action space's words."""
    action_space: str
    """Name of the action space (`babyai_text.actions.ACTION_SPACES`)."""
    mission: str
    """The episode's mission, in the env's language."""
    task_type: str | None
    """Task type of the episode (`goto`, `pickup`, ...), None when unknown."""
    level: str
    """BabyAI level id."""
    episode: int
    """Episode id, unique within the dataset."""
    seed: int
    """Seed the episode's env was reset with."""
    step: int
    """Step of the decision within its episode (0 first)."""
    success: bool
    """Whether the episode ended in success."""
    source: str = "bot"
    """Who acted: `bot` (BabyAI's bot) or a policy's name (`ppo`, ...)."""


_COLUMN_TYPES = {
    "prompt": "string",
    "action": "string",
    "action_index": "int32",
    "action_space": "string",
    "mission": "string",
    "task_type": "string",
    "level": "string",
    "episode": "int64",
    "seed": "int64",
    "step": "int32",
    "success": "bool",
    "source": "string",
}

DEMO_COLUMNS: tuple[str, ...] = tuple(_COLUMN_TYPES)
"""The columns of a demonstrations dataset, in :class:`DemoRecord` order."""

REQUIRED_COLUMNS: tuple[str, ...] = ("prompt", "action")
"""Columns behavioural cloning cannot do without; the others are bookkeeping."""

assert tuple(f.name for f in fields(DemoRecord)) == DEMO_COLUMNS


@cache
def demo_features() -> Features:
    """Column types of a demonstrations dataset (`datasets.Features`), in `DEMO_COLUMNS` order."""
    from datasets import Features, Value

    return Features({name: Value(dtype) for name, dtype in _COLUMN_TYPES.items()})


class DemoDatasetError(ValueError):
    """A demonstrations folder is missing, empty, not a dataset, or lacks a required column."""


def demo_metadata(dataset: Dataset) -> dict[str, Any]:
    """The metadata dict a dataset was written with (collection settings), or `{}`."""
    try:
        return json.loads(dataset.info.description or "{}")
    except json.JSONDecodeError:
        return {}


def _to_row(record: DemoRecord | Mapping[str, Any]) -> dict[str, Any]:
    row = asdict(record) if isinstance(record, DemoRecord) else dict(record)
    missing = [name for name in DEMO_COLUMNS if name not in row and name != "source"]
    if missing:
        raise ValueError(f"demonstration row lacks {missing}; a row needs {list(DEMO_COLUMNS)}")
    row.setdefault("source", "bot")
    unknown = sorted(set(row) - set(DEMO_COLUMNS))
    if unknown:
        raise ValueError(f"demonstration row has unknown fields {unknown}")
    return row


def write_demos(
    records: Iterable[DemoRecord | Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    metadata: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    key: str = "demos.output_dir",
    overwrite_key: str = "demos.overwrite",
) -> Dataset:
    """Save demonstrations as a dataset folder, atomically; return the dataset.

    Args:
        records: :class:`DemoRecord` objects, or mappings with the same keys.
        path: the dataset folder to create.
        metadata: JSON-serialisable collection settings, kept in the dataset's description.
        overwrite: replace an earlier dataset in `path` (otherwise one there is an error).
            Nothing else is ever replaced: a folder holding other files is refused.
        key, overwrite_key: the options that named `path` and allow replacing, for messages.

    Raises:
        ValueError: no records, or a record with missing or unknown fields.
        glam.outputs.OutputDirError: `path` cannot take a dataset (`check_output_dir`); an
            `OutputExistsError` (a `FileExistsError`) when it holds one and `overwrite` is false.
    """
    path = Path(path)
    rows = [_to_row(record) for record in records]
    if not rows:
        raise ValueError(f"no demonstrations to write to {path}")
    check_output_dir(path, DEMOS, key=key, overwrite=overwrite, overwrite_key=overwrite_key)
    from datasets import Dataset, DatasetInfo, load_from_disk

    columns = {name: [row[name] for row in rows] for name in DEMO_COLUMNS}
    features = demo_features()
    info = DatasetInfo(
        description=json.dumps(dict(metadata or {}), sort_keys=True), features=features
    )
    dataset = Dataset.from_dict(columns, features=features, info=info)

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the dataset is an ordinary folder
    old = path.parent / f"{tmp.name}.old"
    try:
        dataset.save_to_disk(str(tmp))
        if path.exists():
            path.rename(old)  # keep the old copy until the new one is in place
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return load_from_disk(str(path))


class DemoWriter:
    """Collects demonstration rows and saves them atomically when closed.

    Used as a context manager, it saves on a clean exit and writes nothing if the block raises,
    so a crash leaves either no folder or the previous complete one.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(path)
        self.metadata = dict(metadata or {})
        self.overwrite = overwrite
        # Fail before the (long) collection, not after it; `save` checks again.
        check_output_dir(
            self.path,
            DEMOS,
            key="demos.output_dir",
            overwrite=overwrite,
            overwrite_key="demos.overwrite",
        )
        self.rows: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, record: DemoRecord | Mapping[str, Any]) -> None:
        """Append one decision."""
        self.rows.append(_to_row(record))

    def extend(self, records: Iterable[DemoRecord | Mapping[str, Any]]) -> None:
        """Append several decisions (e.g. a finished episode)."""
        self.rows.extend(_to_row(record) for record in records)

    def save(self) -> Dataset:
        """Write the rows collected so far; return the saved dataset."""
        return write_demos(self.rows, self.path, metadata=self.metadata, overwrite=self.overwrite)

    def __enter__(self) -> DemoWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, traceback: object) -> None:
        if exc_type is None:
            self.save()


def load_demos(
    path: str | os.PathLike[str],
    *,
    required: Iterable[str] = REQUIRED_COLUMNS,
    keep_in_memory: bool = False,
) -> Dataset:
    """Load a demonstrations folder, checking that it is a non-empty dataset with `required`.
    `keep_in_memory`: read it into memory, so that what is computed from it (`Dataset.map`)
    writes no cache file into the folder (a reader must leave a dataset as it found it).

    A folder of datasets (a PPO run's `rollouts/`, written in parts with each checkpoint) is
    loaded as their concatenation, in path order, with the first part's metadata.

    Raises:
        DemoDatasetError: with a message that says what is wrong and how to make a good one.
    """
    path = Path(path)
    hint = "collect one with `python scripts/collect_bot_demos.py demos.output_dir=...`"
    if not path.is_dir():
        raise DemoDatasetError(f"no demonstrations folder at {path}; {hint}")
    if not any(path.iterdir()):
        raise DemoDatasetError(f"demonstrations folder {path} is empty; {hint}")
    from datasets import DatasetDict, concatenate_datasets, load_from_disk

    parts = _dataset_parts(path)
    if parts:
        datasets = [
            load_demos(part, required=required, keep_in_memory=keep_in_memory) for part in parts
        ]
        merged = concatenate_datasets(datasets)
        merged.info.description = datasets[0].info.description
        return merged
    if _saved_without_rows(path):  # `load_from_disk` fails on it with a bare IndexError
        raise DemoDatasetError(f"demonstrations dataset {path} has no rows; {hint}")
    try:
        dataset = load_from_disk(str(path), keep_in_memory=keep_in_memory)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as error:
        raise DemoDatasetError(
            f"{path} is not a dataset saved with `Dataset.save_to_disk` ({error}); {hint}"
        ) from None
    if isinstance(dataset, DatasetDict):
        raise DemoDatasetError(
            f"{path} holds a DatasetDict with splits {list(dataset)}; expected one Dataset "
            "(the split into train and eval is made at training time)"
        )
    missing = [name for name in required if name not in dataset.column_names]
    if missing:
        raise DemoDatasetError(
            f"demonstrations dataset {path} lacks the column(s) {missing}; it has "
            f"{dataset.column_names}, and behavioural cloning needs {list(required)}"
        )
    if len(dataset) == 0:
        raise DemoDatasetError(f"demonstrations dataset {path} has no rows; {hint}")
    return dataset


def _dataset_parts(path: Path) -> list[Path]:
    """Dataset folders below `path` when `path` itself is not one (none otherwise)."""
    if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
        return []
    return sorted(info.parent for info in path.rglob("dataset_info.json"))


def _saved_without_rows(path: Path) -> bool:
    state = path / "state.json"
    try:
        return state.is_file() and json.loads(state.read_text()).get("_data_files") == []
    except json.JSONDecodeError:
        return False


def split_pairs(pairs: Dataset, eval_fraction: float, seed: int) -> tuple[Dataset, Dataset]:
    """Hold out `eval_fraction` of the episodes (of the pairs if there is no `episode` column).

    Pairs of one episode are strongly correlated, so the held-out set is made of whole episodes:
    its accuracy measures imitation on unseen episodes, not recall of neighbouring steps.
    """
    rng = np.random.default_rng(seed)
    groups = np.asarray(pairs["episode"] if "episode" in pairs.column_names else range(len(pairs)))
    unique = np.unique(groups)
    if len(unique) < 2:
        raise DemoDatasetError(
            f"cannot split {len(pairs)} pairs from {len(unique)} episode(s) into train and eval"
        )
    n_eval = min(len(unique) - 1, max(1, round(eval_fraction * len(unique))))
    held_out = rng.choice(unique, size=n_eval, replace=False)
    is_eval = np.isin(groups, held_out)
    return pairs.select(np.flatnonzero(~is_eval)), pairs.select(np.flatnonzero(is_eval))


@dataclass
class ReplayedStep:
    """One recorded decision, replayed (`replay_demonstrations`)."""

    index: int
    """Its position in the rows replayed."""
    obs: dict[str, Any]
    """The env's observation before the recorded action: what its prompt shows (checked)."""
    info: dict[str, Any]
    env: Any
    """The env in that state, until the iteration goes on."""
    after: tuple[dict[str, Any], float, bool, bool, dict[str, Any]] | None = None
    """`(obs, reward, terminated, truncated, info)` of the recorded action, filled when the
    iteration goes on."""


def replay_demonstrations(
    rows: Sequence[Mapping[str, Any]],
    level: str,
    action_space: str,
    language: str | None = None,
    *,
    error: type[Exception] = DemoDatasetError,
) -> Iterator[ReplayedStep]:
    """Each demonstrated episode of `rows` (demonstration rows, in any order) replayed: its env
    reset with its seed and stepped with its recorded actions (`action_index`) in step order.
    Yields every recorded decision before its action, episode by episode; the action is taken
    when the iteration goes on, its outcome kept in the step's `after`.

    Raises:
        error: an episode's steps are not 0, 1, 2..., its replay does not show what a recorded
            prompt shows (another mission, or an observation missing from the prompt: another
            level, action space or version of the env), or it ends before its last recorded
            step; the level or action space is unknown.
    """
    try:
        env = babyai_text.make(level, action_space=action_space, language=language)
    except ValueError as problem:
        raise error(str(problem)) from None
    by_episode: dict[int, list[int]] = {}
    for index, row in enumerate(rows):
        by_episode.setdefault(row["episode"], []).append(index)
    try:
        for episode, indices in by_episode.items():
            indices.sort(key=lambda i: rows[i]["step"])
            steps = [rows[i]["step"] for i in indices]
            if steps != list(range(len(steps))):
                raise error(
                    f"episode {episode}: its steps are {steps[:8]}..., not 0, 1, 2...: the "
                    "replay needs every action from the episode's start"
                )
            obs, info = env.reset(seed=rows[indices[0]]["seed"])
            ended = False
            for index in indices:
                row = rows[index]
                if ended:
                    raise error(
                        f"episode {episode} (seed {row['seed']}) ended in its replay before its "
                        f"recorded step {row['step']}"
                    )
                if obs["mission"] != row["mission"] or not all(
                    f" {sentence}," in row["prompt"] for sentence in info["descriptions"]
                ):
                    raise error(
                        f"episode {episode} (seed {row['seed']}) step {row['step']}: replaying "
                        "its actions does not reproduce its prompt; were the demonstrations "
                        "recorded with another level, action space or version of the env?"
                    )
                step = ReplayedStep(index, obs, info, env)
                yield step
                obs, reward, terminated, truncated, info = env.step(row["action_index"])
                step.after = (obs, float(reward), bool(terminated), bool(truncated), info)
                ended = bool(terminated or truncated)
    finally:
        env.close()
