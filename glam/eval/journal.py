"""The journal of an evaluation in progress: what a kill, a crash or a pre-emption leaves behind.

Torch-free: the campaign launcher reads it (`Journal.found`).

`glam.eval.harness.evaluate` appends every finished episode to `episodes.partial.jsonl` in
`eval.output_dir` (flushed to disk at once) and removes the journal once its results are written.
An evaluation stopped before its end (a long run of BALROG's protocol on a CPU, a pre-empted
SLURM job) keeps its finished episodes there; run again with `eval.resume=true` and the same
settings, it plays only the others and writes the results of all of them.

Lines, one JSON object each:
- `{"kind": "start", "settings": {...}, "episodes_done": n, "at": ...}`: the first line, and
  one more for each resumed process, with the episodes it found finished;
- `{"kind": "episode", "suite": ..., "episode": {...}, "prompts_seen": n, "prompts_rewritten":
  n, "elapsed": s, "usage": {...} | null}` (and `example_prompt` in a suite's first): an episode
  as `episodes.jsonl` writes it, its suite's prompt counters over its finished episodes, and the
  seconds and model usage of the evaluation so far, all processes together.

A last line cut short by a kill is dropped with a warning; any other unreadable line stops the
resume with a message. The settings that do not change what an episode plays may differ between
processes (`RESUMABLE`: where the results go, the label, the progress bar, threads, envs
stepped together, the device); any other difference refuses the resume, naming it.

An episode's outcome depends on its seed and the agent only (`glam.eval.episodes`), so a
scoring agent resumed plays the episodes an uninterrupted run would have (up to the float
rounding of batched forwards). Under the generation protocol a batch's sampling seed is drawn
from the seeds of its conversations (`glam.llm.local`): the episodes played after a resume are
other samples of the same protocol.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glam.eval.stats import EpisodeResult

__all__ = [
    "JOURNAL",
    "RESUMABLE",
    "Journal",
    "JournalError",
    "SuiteProgress",
    "journal_settings",
]

JOURNAL = "episodes.partial.jsonl"
"""The journal's file name in `eval.output_dir`."""

RESUMABLE = {
    "eval": (
        "output_dir",
        "overwrite",
        "resume",
        "progress_bar",
        "torch_threads",
        "num_envs",
        "label",
    ),
    "agent": ("device", "batch_size"),
}
"""Settings a resumed evaluation may change: none changes what an episode plays."""


@dataclass
class SuiteProgress:
    """What a suite's run has finished: its episodes and the prompts of those episodes
    (`glam.eval.episodes.SuiteRun` adds what it plays)."""

    episodes: list[EpisodeResult] = field(default_factory=list)
    prompts_seen: int = 0
    """Prompts built for the finished episodes (one per step)."""
    prompts_rewritten: int = 0
    """Of those, prompts the suite's rewrite changed."""
    example_prompt: str = ""
    """The first prompt the agent read, after the rewrite."""


class JournalError(ValueError):
    """A journal that cannot be resumed: unreadable, or written with other settings."""


def journal_settings(agent: Any, eval_: Any) -> dict[str, Any]:
    """The settings a resume must keep: `agent` and `eval` as JSON, less `RESUMABLE`."""
    sections = {"agent": asdict(agent), "eval": asdict(eval_)}
    for section, keys in RESUMABLE.items():
        for key in keys:
            sections[section].pop(key, None)
    return json.loads(json.dumps(sections))  # tuples as lists, as read back


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The keys whose values differ between two settings trees, dotted."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            found += _differences(old.get(key), new.get(key), f"{prefix}{key}.")
        return found
    return [] if old == new else [f"{prefix[:-1]} (was {old!r}, now {new!r})"]


class Journal:
    """The finished episodes of an evaluation, on disk as they finish.

    `Journal.open` starts a journal (or continues one with `resume=True`); `earlier` then holds
    what earlier processes finished, by suite; `record` appends an episode (the file is written
    from the first one on: an evaluation that stops before it leaves nothing); `close` removes
    the file once the results are written.
    """

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path = path
        self.settings = settings
        self.earlier: dict[str, SuiteProgress] = {}
        """What earlier processes finished, by suite."""
        self.earlier_elapsed = 0.0
        """Seconds the earlier processes had run by their last finished episode."""
        self.earlier_usage: dict[str, Any] | None = None
        """The model usage of the earlier processes by their last finished episode (generation)."""
        self.resumes = 0
        """Processes before this one."""
        self._started = time.perf_counter()
        self._handle: Any = None
        self._resume = False
        self._prompted: set[str] = set()
        """Suites whose example prompt the journal holds."""

    @property
    def episodes_done(self) -> int:
        """Episodes the earlier processes finished."""
        return sum(len(progress.episodes) for progress in self.earlier.values())

    @staticmethod
    def found(output_dir: str | Path) -> int | None:
        """Episodes in the journal of `output_dir`; None when it has none."""
        path = Path(output_dir) / JOURNAL
        if not path.is_file():
            return None
        with path.open() as handle:
            return sum('"kind": "episode"' in line for line in handle)

    @classmethod
    def open(cls, output_dir: str | Path, settings: dict[str, Any], *, resume: bool) -> Journal:
        """Start the journal of an evaluation into `output_dir`, or continue its earlier one.

        Raises:
            JournalError: `resume` and no journal, or one that is unreadable or was written with
                other settings (the message names them).
        """
        path = Path(output_dir) / JOURNAL
        journal = cls(path, settings)
        if resume:
            if not path.is_file():
                raise JournalError(
                    f"eval.resume=true: {output_dir} holds no unfinished evaluation (no {JOURNAL}); "
                    "drop eval.resume to start one"
                )
            journal._read()
        journal._resume = resume
        return journal

    def _read(self) -> None:
        lines = self.path.read_text().splitlines()
        records = []
        for number, line in enumerate(lines, 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                if number == len(lines):  # the line being written when the process stopped
                    warnings.warn(
                        f"{self.path}: its last line is cut short (the process stopped while "
                        "writing it); that episode is played again",
                        stacklevel=3,
                    )
                    continue
                raise JournalError(
                    f"{self.path}, line {number}: not JSON; the journal is damaged: start again "
                    "with eval.overwrite=true"
                ) from None
        starts = [record for record in records if record.get("kind") == "start"]
        if not starts:
            raise JournalError(
                f"{self.path} has no start line: start again with eval.overwrite=true"
            )
        changed = _differences(starts[0]["settings"], self.settings)
        if changed:
            raise JournalError(
                f"eval.resume=true: {self.path} was written with other settings: "
                f"{'; '.join(changed)}. Resume with the same settings, or start again with "
                "eval.overwrite=true"
            )
        self.resumes = len(starts)
        for record in records:
            if record.get("kind") != "episode":
                continue
            progress = self.earlier.setdefault(record["suite"], SuiteProgress())
            progress.episodes.append(EpisodeResult(**record["episode"]))
            progress.prompts_seen = record["prompts_seen"]
            progress.prompts_rewritten = record["prompts_rewritten"]
            progress.example_prompt = record.get("example_prompt", progress.example_prompt)
            self.earlier_elapsed = record["elapsed"]
            self.earlier_usage = record["usage"]
        self._prompted = {name for name, run in self.earlier.items() if run.example_prompt}

    def elapsed(self) -> float:
        """Seconds of the evaluation so far, the earlier processes' included."""
        return self.earlier_elapsed + time.perf_counter() - self._started

    def usage(self, current: dict[str, Any] | None) -> dict[str, Any] | None:
        """The model usage of this process (`GenerationAgent.usage`) plus the earlier ones'."""
        if current is None or self.earlier_usage is None:
            return current
        return {
            key: value + self.earlier_usage.get(key, 0)
            if isinstance(value, int) and not isinstance(value, bool)
            else value
            for key, value in current.items()
        }

    def record(
        self,
        suite: str,
        episode: EpisodeResult,
        run: SuiteProgress,
        usage: dict[str, Any] | None,
    ) -> None:
        """Append a finished episode of `suite`, `run`'s counters as they are now (a
        `glam.eval.episodes.SuiteRun`, read as the `SuiteProgress` it extends: the journal sits
        below the episodes' module and does not import it)."""
        record: dict[str, Any] = {
            "kind": "episode",
            "suite": suite,
            "episode": asdict(episode),
            "prompts_seen": run.prompts_seen,
            "prompts_rewritten": run.prompts_rewritten,
            "elapsed": round(self.elapsed(), 3),
            "usage": self.usage(usage),
        }
        if suite not in self._prompted:  # once a suite
            record["example_prompt"] = run.example_prompt
            self._prompted.add(suite)
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self._handle is None:  # the first episode: nothing is written before it
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle = self.path.open("a" if self._resume else "w")
            start = {
                "kind": "start",
                "settings": self.settings,
                "episodes_done": self.episodes_done,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            self._handle.write(json.dumps(start) + "\n")
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def close(self, *, remove: bool) -> None:
        """Close the file; `remove` once the results are written."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if remove:
            self.path.unlink(missing_ok=True)
