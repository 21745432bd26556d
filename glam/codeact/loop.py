"""RL-GPT's outer loop without the trainer: each iteration the slow agent chooses the sub-actions
to code, the fast agent writes them, the RL phase runs (the trainer's part), and the critic
reviews the phase's statistics into the next iteration's feedback.

The policy sees the coded actions in `num_actions` slots after the primitive actions (a
network's outputs are fixed in number). An action the critic carries over keeps its slot (and
what the policy learned of it); a new action takes a freed slot, whose output then starts
afresh (`slot_changes` says which). Names the writer refuses are replaced by asking the
chooser again; a name dropped or refused in any iteration is never proposed again. When no
candidate is left, the freed slot keeps its previous action.

`OuterLoop` holds the slow agent, the fast agent and the records; it runs in one process (the
main one) and hands each `Iteration` to the others as plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from glam.codeact.critic import Critic, CriticRules, Feedback, Iteration
from glam.codeact.env import CodedActionStats
from glam.codeact.planner import ActionChooser, MissionFamily
from glam.codeact.writer import ActionWriter, refusals, sources

__all__ = ["OuterLoop", "slot_changes"]

_CHOOSER_ROUNDS = 4
"""Times the chooser is asked to replace refused names within one iteration."""


def slot_changes(before: list[str], after: list[str]) -> list[int]:
    """The slots whose action differs between two slot lists of the same length."""
    return [i for i, (old, new) in enumerate(zip(before, after, strict=True)) if old != new]


class OuterLoop:
    """The iterations of one run (module docstring)."""

    def __init__(
        self,
        family: MissionFamily,
        chooser: ActionChooser,
        writer: ActionWriter,
        num_actions: int,
        *,
        rules: CriticRules | None = None,
        folder: str | Path | None = None,
        critic: Critic | None = None,
    ) -> None:
        """
        Args:
            family: the level, as the slow agent knows it.
            chooser, writer: the slow and the fast agent.
            num_actions: the coded-action slots.
            rules: when the critic judges an action failing.
            folder: where each iteration is saved (`iteration_<k>.json`); None: nowhere.
            critic: who decides after each phase (None: the rules, `Critic`).
        """
        if num_actions < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}")
        self.family = family
        self.chooser = chooser
        self.writer = writer
        self.num_actions = num_actions
        self.rules = rules or CriticRules()
        self.critic = critic or Critic()
        self.folder = None if folder is None else Path(folder)
        self.iterations: list[Iteration] = []

    @property
    def current(self) -> Iteration:
        return self.iterations[-1]

    @property
    def dropped(self) -> dict[str, str]:
        """Every name dropped or refused so far, and why (never proposed again), read from the
        iterations' records."""
        dropped = {}
        for iteration in self.iterations:
            dropped |= {
                name: f"iteration {iteration.index}: {why}"
                for name, why in iteration.refused.items()
            }
            dropped |= {
                name: f"iteration {iteration.index}: {decision.reason}"
                for name, decision in iteration.decisions.items()
                if decision.verdict == "drop"
            }
        return dropped

    def begin(self, start_frames: int = 0, feedback: Feedback | None = None) -> Iteration:
        """The next iteration's action set (the first one's without feedback); saved.

        Raises:
            ValueError: the first iteration cannot fill its slots (fewer codable candidates
                than `num_actions`).
        """
        previous = self.iterations[-1] if self.iterations else None
        kept = {}
        if previous is not None and feedback is not None:
            kept = {
                name: previous.sources[name]
                for name, report in feedback.actions.items()
                if report.verdict == "keep"
            }
        to_rewrite = (
            []
            if feedback is None
            else [name for name, report in feedback.actions.items() if report.verdict == "rewrite"]
        )
        refused: dict[str, str] = {}
        written: dict[str, str] = {}
        origins = {name: previous.origins[name] for name in kept} if previous else {}
        plan = None
        reports = {} if feedback is None else feedback.actions
        last_refused = {} if feedback is None else feedback.refused
        earlier = {
            name: why
            for name, why in self.dropped.items()
            if name not in reports and name not in last_refused
        }
        # Carried actions come first in the plan; the chooser fills the rest.
        for _ in range(_CHOOSER_ROUNDS):
            asked = Feedback(
                {name: report for name, report in reports.items() if name not in refused},
                {**last_refused, **refused},
                earlier,
            )
            plan = self.chooser.choose(self.family, self.num_actions, asked)
            new = [name for name in plan.coded if name not in kept and name not in written]
            if not new:
                break
            drafts = self.writer.write(new, self.family, feedback)
            written |= sources(drafts)
            origins |= {draft.name: draft.origin for draft in drafts if draft.admitted}
            refused |= refusals(drafts)
            if len(kept) + len(written) >= self.num_actions:
                break
        assert plan is not None
        chosen = {**kept, **written}
        # Rewritten actions whose new code was refused leave their slot like dropped ones.
        chosen = {name: chosen[name] for name in [*plan.coded, *chosen] if name in chosen}
        slots = self._assign_slots(previous, chosen)
        iteration = Iteration(
            index=len(self.iterations),
            chooser=self.chooser.name,
            writer=self.writer.name,
            sources={name: self._source(name, chosen, previous) for name in slots},
            origins={name: origins.get(name, "library") for name in slots},
            refused=refused,
            left_to_rl=[name for name in plan.left_to_rl if name not in slots],
            start_frames=start_frames,
            rewritten=[name for name in to_rewrite if name in written],
        )
        self.iterations.append(iteration)
        self.save(iteration)
        return iteration

    def restore(self, iterations: list[Iteration]) -> None:
        """Continue after `iterations` (read back from a run folder): the last one is the
        current one, its review to come."""
        self.iterations = list(iterations)

    def _assign_slots(self, previous: Iteration | None, chosen: dict[str, str]) -> list[str]:
        if previous is None:
            if len(chosen) < self.num_actions:
                raise ValueError(
                    f"only {len(chosen)} sub-actions of {self.family.level} could be coded "
                    f"({list(chosen)}), fewer than codeact.num_actions={self.num_actions}"
                )
            return list(chosen)[: self.num_actions]
        slots = list(previous.sources)
        incoming = [name for name in chosen if name not in slots]
        for i, name in enumerate(slots):
            if name not in chosen and incoming:
                slots[i] = incoming.pop(0)
        return slots  # a slot nothing replaces keeps its previous action

    @staticmethod
    def _source(name: str, chosen: dict[str, str], previous: Iteration | None) -> str:
        return chosen[name] if name in chosen else previous.sources[name]

    def review(self, stats: Mapping[str, CodedActionStats], end_frames: int) -> Feedback:
        """Record the current phase's statistics and the critic's decisions (saved); the
        feedback for the next iteration."""
        iteration = self.current
        feedback = iteration.review(stats, self.rules, self.critic)
        iteration.end_frames = end_frames
        self.save(iteration)
        return feedback

    def save(self, iteration: Iteration) -> None:
        if self.folder is not None:
            iteration.save(self.folder)
