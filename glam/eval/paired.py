"""Two evaluations of the same episodes compared episode by episode.

Every evaluation plays fixed seeds (`eval.seed`, `eval.episodes_per_task_type`), so two agents
evaluated with the same settings played the same rooms and missions: their episodes pair up by
seed. On such pairs the test is McNemar's (`glam.eval.stats.mcnemar_exact_p`): only the
discordant pairs (one agent solved the episode, the other did not) say which is better. That is
the comparison of an agent against its control on one set of episodes (a trained checkpoint
against `agent.kind=constant`, a model against the same model zero-shot); over training seeds,
`glam.eval.stats.compare_seeds` is the test. `scripts/compare_episodes.py` prints it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from glam.eval.stats import mcnemar_exact_p
from glam.eval.suites import TASK_FAMILIES
from glam.outputs import EPISODES_JSONL

__all__ = ["ALL", "PairedRow", "compare_paired", "format_table", "read_episodes"]

ALL = "all"
"""The row of every paired episode, after the rows of the task types."""


@dataclass(frozen=True)
class PairedRow:
    """One task type's paired episodes (or `ALL` of them)."""

    task_type: str
    episodes: int
    successes_a: int
    successes_b: int
    only_a: int
    """Episodes agent a solved and agent b did not."""
    only_b: int
    """Episodes agent b solved and agent a did not."""
    same_actions: int
    """Episodes both played action for action alike (both files must record actions)."""

    @property
    def p_value(self) -> float:
        """McNemar's exact two-sided p-value of the discordant pairs."""
        return mcnemar_exact_p(self.only_a, self.only_b)


def read_episodes(path: Path, suite: str) -> dict[int, Mapping]:
    """`suite`'s episodes in an evaluation, by seed: `path` is the evaluation's folder or its
    episodes.jsonl.

    Raises:
        ValueError: no such file, a line that is not an episode record, no episode of `suite`
            (the message names the suites there are), or a seed played twice.
    """
    file = path / EPISODES_JSONL if path.is_dir() else path
    try:
        lines = file.read_text().splitlines()
    except OSError as error:
        raise ValueError(f"{file}: cannot read the episodes ({error.strerror or error})") from None
    episodes: dict[int, Mapping] = {}
    suites: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            record_suite, seed, success = record["suite"], int(record["seed"]), record["success"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{file}, line {number}: not an episode record (suite, seed, success) of an "
                "evaluation's episodes.jsonl"
            ) from None
        suites.add(record_suite)
        if record_suite != suite:
            continue
        if seed in episodes:
            raise ValueError(f"{file}: seed {seed} of suite {suite!r} is played twice")
        episodes[seed] = record | {"success": bool(success)}
    if not episodes:
        found = ", ".join(sorted(suites)) or "none"
        raise ValueError(f"{file}: no episode of suite {suite!r} (suites there: {found})")
    return episodes


def _row(task_type: str, seeds: list[int], a: Mapping, b: Mapping) -> PairedRow:
    solved_a = [a[seed]["success"] for seed in seeds]
    solved_b = [b[seed]["success"] for seed in seeds]
    return PairedRow(
        task_type=task_type,
        episodes=len(seeds),
        successes_a=sum(solved_a),
        successes_b=sum(solved_b),
        only_a=sum(x and not y for x, y in zip(solved_a, solved_b, strict=True)),
        only_b=sum(y and not x for x, y in zip(solved_a, solved_b, strict=True)),
        same_actions=sum(
            bool(a[seed].get("actions")) and a[seed].get("actions") == b[seed].get("actions")
            for seed in seeds
        ),
    )


def compare_paired(a: Mapping[int, Mapping], b: Mapping[int, Mapping]) -> list[PairedRow]:
    """One row per task type (grouped as the reports group them, `TASK_FAMILIES`; `unknown` when
    an episode has none), then `ALL`, over the seeds both evaluations played.

    Raises:
        ValueError: the two share no seed (other `eval.seed`, level or episode counts), or a
            seed whose mission differs between them (not the same episode).
    """
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(
            "the two evaluations share no seed: evaluate both with the same eval.seed, level "
            "and episode counts"
        )
    for seed in seeds:
        if a[seed].get("mission") != b[seed].get("mission"):
            raise ValueError(
                f"seed {seed} is not the same episode in both: missions {a[seed].get('mission')!r}"
                f" and {b[seed].get('mission')!r} (another level or suite)"
            )
    by_type: dict[str, list[int]] = {}
    for seed in seeds:
        task = a[seed].get("task_type") or "unknown"
        by_type.setdefault(TASK_FAMILIES.get(task, task), []).append(seed)
    rows = [_row(name, by_type[name], a, b) for name in sorted(by_type)]
    return [*rows, _row(ALL, seeds, a, b)]


def format_table(rows: list[PairedRow], label_a: str, label_b: str) -> str:
    """A markdown table of `rows`: successes of each, the discordant pairs, McNemar's p."""
    lines = [
        f"| task type | episodes | {label_a} solved | {label_b} solved | only {label_a} "
        f"| only {label_b} | same actions | McNemar p |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        name = f"**{row.task_type}**" if row.task_type == ALL else row.task_type
        lines.append(
            f"| {name} | {row.episodes} | {row.successes_a} | {row.successes_b} | {row.only_a} "
            f"| {row.only_b} | {row.same_actions} | {row.p_value:.3g} |"
        )
    return "\n".join(lines)
