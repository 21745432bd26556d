"""The critic's bookkeeping: after an RL phase, what becomes of each coded action, what the slow
agent hears about it, and the record of the outer iteration.

- `judge` reads each coded action's statistics over the phase (`CodedActionsEnv.pop_stats`)
  and decides: **drop** an action nobody used (zero uses over the phase), one that never
  achieved anything (at least `CriticRules.min_uses` uses, none finished with "done", no
  reward: e.g. a box it cannot reach behind a locked door), or one that keeps
  failing (more than `CriticRules.max_failure_rate` of its uses, with at least
  `CriticRules.min_uses` uses, so that one unlucky call does not condemn it); a failing action
  whose code was generated is **rewritten** instead (its errors go back to the code writer),
  since library code would only fail the same way again, but only once: a rewritten action
  that keeps failing is dropped; every other action is **kept**.
- `Critic` applies `judge`; `glam.codeact.chat_critic.ChatCritic` (`codeact.critic=chat`) asks
  a chat model instead, as RL-GPT's critic is a language model, and falls back on `judge` for
  an action it leaves undecided.
- `Feedback` is what the slow agent reads before the next iteration: per coded action its uses,
  finished executions, failures by kind, last errors and the decision; and the names whose code
  was refused before the phase (`glam.codeact.writer`), with the reason.
- `Iteration` is one outer iteration's record: the chosen names (in the policy's slot order),
  their source and origin, the names refused and why, the run's frames at the phase's start
  and end, the statistics and the decisions. `save(folder)` writes it as JSON
  (`iteration_<k>.json`) in the run folder; `Iteration.load` and `load_iterations` read it back.

Everything here is plain data and pure functions: no model, no env.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from glam.codeact.env import CodedActionStats

__all__ = [
    "VERDICTS",
    "ActionReport",
    "Critic",
    "CriticRules",
    "Decision",
    "Feedback",
    "Iteration",
    "judge",
    "load_iterations",
    "stats_record",
    "total_stats",
]

VERDICTS: tuple[str, ...] = ("keep", "drop", "rewrite")


@dataclass(frozen=True)
class CriticRules:
    """When a coded action counts as failing."""

    max_failure_rate: float = 0.5
    """Failed executions per use above which an action fails."""
    min_uses: int = 5
    """Uses an action needs before its failure rate is trusted."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_failure_rate < 1.0:
            raise ValueError(f"max_failure_rate must be in [0, 1), got {self.max_failure_rate}")
        if self.min_uses < 1:
            raise ValueError(f"min_uses must be >= 1, got {self.min_uses}")


@dataclass(frozen=True)
class Decision:
    """What becomes of one coded action, and why (one line)."""

    verdict: str
    """One of `VERDICTS`."""
    reason: str


def judge(
    stats: Mapping[str, CodedActionStats],
    rules: CriticRules | None = None,
    rewritable: Collection[str] = (),
) -> dict[str, Decision]:
    """The decision on each coded action (see the module docstring).

    Args:
        stats: each coded action's statistics over the phase (summed over envs).
        rules: what counts as failing; the defaults if None.
        rewritable: the actions whose code can be written again (generated, not library).
    """
    rules = rules or CriticRules()
    decisions = {}
    for name, entry in stats.items():
        failed = entry.outcomes["failed"]
        if entry.uses == 0:
            decisions[name] = Decision("drop", "unused over the phase")
        elif entry.uses >= rules.min_uses and failed / entry.uses > rules.max_failure_rate:
            kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(entry.failures.items()))
            last = f"; last error: {entry.errors[-1]}" if entry.errors else ""
            reason = f"failed {failed} of {entry.uses} uses ({kinds}){last}"
            decisions[name] = Decision("rewrite" if name in rewritable else "drop", reason)
        elif entry.uses >= rules.min_uses and not entry.finished and entry.reward <= 0:
            outcomes = ", ".join(f"{k} {n}" for k, n in sorted(entry.outcomes.items()))
            reason = f"never finished nor earned a reward in {entry.uses} uses ({outcomes})"
            decisions[name] = Decision("drop", reason)
        else:
            reason = f"used {entry.uses} times, finished {entry.finished}, failed {failed}"
            decisions[name] = Decision("keep", reason)
    return decisions


class Critic:
    """Decides what becomes of each coded action after a phase: here by `judge`'s rules (the
    default, `codeact.critic=rules`)."""

    name = "rules"
    """`rules` or `chat`: in the iteration records."""

    def decide(
        self,
        stats: Mapping[str, CodedActionStats],
        rules: CriticRules | None = None,
        rewritable: Collection[str] = (),
    ) -> dict[str, Decision]:
        """The decision on each coded action of `stats` (the arguments of `judge`)."""
        return judge(stats, rules, rewritable)


def total_stats(
    per_env: Iterable[Mapping[str, CodedActionStats]],
) -> dict[str, CodedActionStats]:
    """The statistics of several envs (or processes), summed per coded action."""
    total: dict[str, CodedActionStats] = {}
    for stats in per_env:
        for name, entry in stats.items():
            total.setdefault(name, CodedActionStats()).add(entry)
    return total


def stats_record(entry: CodedActionStats) -> dict[str, Any]:
    """One action's statistics as plain JSON-able data."""
    return {
        "uses": entry.uses,
        "finished": entry.finished,
        "outcomes": dict(entry.outcomes),
        "failures": dict(entry.failures),
        "errors": list(entry.errors),
        "primitive_steps": entry.primitive_steps,
        "reward": entry.reward,
    }


@dataclass(frozen=True)
class ActionReport:
    """What the slow agent hears about one coded action."""

    name: str
    uses: int
    finished: int
    failures: dict[str, int]
    """Failed executions by error kind."""
    errors: list[str]
    """The last few distinct error messages, oldest first."""
    verdict: str
    reason: str

    def describe(self) -> str:
        """One line: `name: used 12 times, finished 10, failures runtime 2; last error: ...;
        kept`."""
        failures = ", ".join(f"{kind} {count}" for kind, count in sorted(self.failures.items()))
        text = f"{self.name}: used {self.uses} times, finished {self.finished}"
        if failures:
            text += f", failures {failures}"
        if self.errors:
            text += f"; last error: {self.errors[-1]}"
        done = {"keep": "kept", "drop": "dropped", "rewrite": "to be rewritten"}[self.verdict]
        return f"{text}; {done}"


@dataclass(frozen=True)
class Feedback:
    """What the slow agent reads about the previous iteration."""

    actions: dict[str, ActionReport] = field(default_factory=dict)
    """The coded actions the phase ran, by name."""
    refused: dict[str, str] = field(default_factory=dict)
    """Names whose code was refused before the phase, and why."""
    earlier: dict[str, str] = field(default_factory=dict)
    """Names dropped or refused in earlier iterations, and why: not proposed again either."""

    def carried(self) -> list[str]:
        """The actions that stay in the next iteration (kept or to be rewritten)."""
        return [name for name, report in self.actions.items() if report.verdict != "drop"]

    def excluded(self) -> set[str]:
        """The names not to propose again (dropped, or their code refused)."""
        dropped = {name for name, report in self.actions.items() if report.verdict == "drop"}
        return dropped | set(self.refused) | set(self.earlier)

    def lines(self) -> list[str]:
        """The feedback as lines of text, for a prompt."""
        lines = [report.describe() for report in self.actions.values()]
        lines += [
            f"{name}: its code was refused ({why}); dropped" for name, why in self.refused.items()
        ]
        lines += [f"{name}: dropped earlier ({why})" for name, why in self.earlier.items()]
        return lines


@dataclass
class Iteration:
    """One outer iteration: the action set, its code, its results (module docstring)."""

    index: int
    chooser: str
    """Which slow agent chose the names (`local`: the scored chooser, `chat`, `random`, `fixed`)."""
    writer: str
    """Which fast agent wrote the code (`library`, `chat`)."""
    sources: dict[str, str]
    """The coded actions that went into the phase, name -> source, in the policy's slot order."""
    origins: dict[str, str]
    """name -> `library` or `generated`."""
    refused: dict[str, str] = field(default_factory=dict)
    """Chosen names whose code was refused (validation), and why."""
    left_to_rl: list[str] = field(default_factory=list)
    """Candidate sub-actions not coded: left to the RL policy's primitive actions."""
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each coded action's statistics over the phase (`stats_record`); empty before review."""
    decisions: dict[str, Decision] = field(default_factory=dict)
    """The critic's decision on each coded action; empty before review."""
    start_frames: int = 0
    """The run's frames when the phase began."""
    end_frames: int | None = None
    """The run's frames when the phase was reviewed (None before)."""
    rewritten: list[str] = field(default_factory=list)
    """Actions of the previous iteration whose code was written again for this one."""
    critic: str = "rules"
    """Who decided (`Critic.name`: `rules` or `chat`)."""

    def review(
        self,
        stats: Mapping[str, CodedActionStats],
        rules: CriticRules | None = None,
        critic: Critic | None = None,
    ) -> Feedback:
        """Record the phase's statistics and the critic's decisions (`critic`, by default the
        rules); the slow agent's feedback.

        Generated actions are rewritable once: not library ones, nor those whose code was
        already rewritten for this iteration (failing again, they are dropped; `judge`).
        """
        missing = sorted(set(self.sources) - set(stats))
        if missing:
            raise ValueError(f"no statistics for the coded actions {missing}")
        stats = {name: stats[name] for name in self.sources}
        rewritable = {
            name
            for name, origin in self.origins.items()
            if origin == "generated" and name not in self.rewritten
        }
        critic = critic or Critic()
        self.decisions = critic.decide(stats, rules, rewritable)
        self.critic = critic.name
        self.stats = {name: stats_record(entry) for name, entry in stats.items()}
        return self.feedback()

    def feedback(self) -> Feedback:
        """The slow agent's feedback from this iteration's record."""
        actions = {
            name: ActionReport(
                name=name,
                uses=record["uses"],
                finished=record["finished"],
                failures=dict(record["failures"]),
                errors=list(record["errors"]),
                verdict=self.decisions[name].verdict,
                reason=self.decisions[name].reason,
            )
            for name, record in self.stats.items()
        }
        return Feedback(actions, dict(self.refused))

    def save(self, folder: str | Path) -> Path:
        """Write `folder/iteration_<index>.json` (the folder is created); its path."""
        path = Path(folder) / f"iteration_{self.index:03d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Iteration:
        """The iteration `save` wrote to `path`."""
        data = json.loads(Path(path).read_text())
        data["decisions"] = {name: Decision(**d) for name, d in data["decisions"].items()}
        return cls(**data)


def load_iterations(folder: str | Path) -> list[Iteration]:
    """Every iteration saved in `folder`, in order."""
    return [Iteration.load(path) for path in sorted(Path(folder).glob("iteration_*.json"))]
