"""Hindsight relabelling (HER's "future" strategy) for the GoTo levels of BabyAI-Text.

An episode that did not reach its goal still went to some objects: each step after which the
agent faced an object (its description reads "You see a red ball 1 step forward") achieved the
goal "go to the red ball", and BabyAI would have ended that episode there with its reward,
`1 - 0.9 * steps / max_steps`. At an episode's end (`HindsightBuffer.add_episode`), up to
`goals` such goals other than the episode's own mission are drawn; for each, the steps up to its
first achievement are stored again with the mission replaced by that goal in what the policy
read (the prompt's goal, or the grid policy's mission), as the n-step transitions
(`glam.offpolicy.returns`' windows) of an episode that terminated there with that reward: every
earlier step has that goal in its future. The learner draws a share of each batch from them
(`sac.her_ratio`).

Only the GoTo missions ("go to the/a COLOR TYPE") are relabelled: their success is a fact of one
step's view. The buffer lives in memory and is not checkpointed: a resumed run refills it from
its new episodes (it says so).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from glam.offpolicy.replay import ReplayBatch
from glam.policy.observations import GridObservations, Observations, TextObservations

__all__ = [
    "HindsightBuffer",
    "Step",
    "achieved_goals",
    "cat_batches",
    "hindsight_transitions",
    "is_goto",
    "with_mission",
]

_FACING = re.compile(r"^You see an? (?P<colour>\w+) (?P<kind>\w+) 1 step forward$")
"""The description of the object in front of the agent (BabyAI-Text's English)."""
_GOTO = re.compile(r"^go to (the|a) \w+ \w+$")


def is_goto(mission: str) -> bool:
    """Whether `mission` is a GoTo mission of one described object ("go to the red ball")."""
    return bool(_GOTO.match(mission))


def achieved_goals(descriptions: Sequence[str]) -> list[str]:
    """The GoTo goals a step achieved: one per object the agent faces after it (none or one)."""
    goals = []
    for sentence in descriptions:
        found = _FACING.match(sentence.strip())
        if found:
            goals.append(f"go to the {found['colour']} {found['kind']}")
    return goals


def with_mission(observations: Observations, mission: str, goal: str) -> Observations:
    """`observations` (one env's) as the policy would read them with `goal` for `mission`: the
    prompt's goal replaced, or the grid policy's mission text."""
    if isinstance(observations, TextObservations):
        prompts = []
        for prompt in observations.prompts:
            if prompt.count(mission) != 1:
                raise ValueError(f"the prompt does not name its mission {mission!r} once")
            prompts.append(prompt.replace(mission, goal))
        return TextObservations(prompts, [list(c) for c in observations.candidates])
    if isinstance(observations, GridObservations):
        return GridObservations(
            observations.images.clone(), observations.directions.clone(), [goal] * len(observations)
        )
    raise ValueError(f"cannot relabel {type(observations).__name__}")


@dataclass(frozen=True)
class Step:
    """One step of one env's episode, as HER needs it."""

    obs: Observations
    """What the policy read before the step (one env's)."""
    action: int
    seen: tuple[str, ...]
    """The descriptions after the step (the final ones at an episode's end)."""


@dataclass(frozen=True)
class Transition:
    """One relabelled n-step transition (the fields of `ReplayBatch`, for one step)."""

    obs: Observations
    action: int
    ret: float
    discount: float
    bootstrap: bool
    next_obs: Observations


def hindsight_transitions(
    steps: Sequence[Step],
    mission: str,
    *,
    goals: int,
    gamma: float,
    n: int,
    max_steps: int,
    reward_scale: float = 1.0,
    rng: random.Random | None = None,
) -> list[Transition]:
    """The relabelled transitions of one episode (`steps`, in order) whose goal was `mission`:
    for up to `goals` achieved goals other than `mission` (drawn at random among them, each at
    its first achievement t), steps 0..t as an episode that terminated at t with BabyAI's reward
    `(1 - 0.9 * (t + 1) / max_steps) * reward_scale`, in n-step windows: step s sums the rewards
    of s..s+m-1, m = min(n, t - s + 1), and bootstraps from step s+m's relabelled observation
    (discount gamma^m) unless its window reaches t."""
    first: dict[str, int] = {}
    for t, step in enumerate(steps):
        for goal in achieved_goals(step.seen):
            if goal not in first and goal.split(" ", 3)[-1] != mission.split(" ", 3)[-1]:
                first[goal] = t
    chosen = sorted(first)
    if len(chosen) > goals:
        chosen = sorted((rng or random.Random(0)).sample(chosen, goals))
    transitions = []
    for goal in chosen:
        end = first[goal]
        reward = (1.0 - 0.9 * (end + 1) / max_steps) * reward_scale
        relabelled = [with_mission(step.obs, mission, goal) for step in steps[: end + 1]]
        for s in range(end + 1):
            m = min(n, end - s + 1)
            reaches = s + m - 1 == end
            transitions.append(
                Transition(
                    obs=relabelled[s],
                    action=steps[s].action,
                    ret=gamma ** (end - s) * reward if reaches else 0.0,
                    discount=0.0 if reaches else gamma**m,
                    bootstrap=not reaches,
                    next_obs=relabelled[end] if reaches else relabelled[s + m],
                )
            )
    return transitions


class HindsightBuffer:
    """A ring of `capacity` relabelled transitions (see the module docstring)."""

    def __init__(
        self,
        capacity: int,
        *,
        goals: int,
        gamma: float,
        n: int,
        max_steps: int,
        reward_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        if capacity < 1 or goals < 1:
            raise ValueError(f"a hindsight buffer needs capacity and goals >= 1, got {capacity}")
        self.capacity, self.goals, self.gamma, self.n = capacity, goals, gamma, n
        self.max_steps, self.reward_scale = max_steps, reward_scale
        self.items: list[Transition] = []
        self.position = 0
        self.episodes = 0
        """Episodes that gave at least one relabelled goal."""
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.items)

    def add_episode(self, steps: Sequence[Step], mission: str) -> int:
        """Relabel a finished episode (`hindsight_transitions`) and keep its transitions;
        return how many. An episode of another kind of mission gives none."""
        if not steps or not is_goto(mission):
            return 0
        found = hindsight_transitions(
            steps,
            mission,
            goals=self.goals,
            gamma=self.gamma,
            n=self.n,
            max_steps=self.max_steps,
            reward_scale=self.reward_scale,
            rng=self.rng,
        )
        for transition in found:
            if len(self.items) < self.capacity:
                self.items.append(transition)
            else:
                self.items[self.position] = transition
            self.position = (self.position + 1) % self.capacity
        self.episodes += bool(found)
        return len(found)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> ReplayBatch:
        """`batch_size` transitions drawn uniformly (with replacement)."""
        if not self.items:
            raise ValueError("the hindsight buffer holds no transition yet")
        draws = torch.randint(len(self.items), (batch_size,), generator=generator).tolist()
        picked = [self.items[i] for i in draws]
        kind = type(picked[0].obs)
        return ReplayBatch(
            obs=kind.cat([t.obs for t in picked]),
            actions=torch.tensor([t.action for t in picked], dtype=torch.long),
            returns=torch.tensor([t.ret for t in picked], dtype=torch.float32),
            discounts=torch.tensor([t.discount for t in picked], dtype=torch.float32),
            bootstrap=torch.tensor([t.bootstrap for t in picked], dtype=torch.bool),
            next_obs=kind.cat([t.next_obs for t in picked]),
        )


def cat_batches(first: ReplayBatch, second: ReplayBatch) -> ReplayBatch:
    """Two batches one after the other."""
    kind = type(first.obs)
    return ReplayBatch(
        obs=kind.cat([first.obs, second.obs]),
        actions=torch.cat([first.actions, second.actions]),
        returns=torch.cat([first.returns.float(), second.returns.float()]),
        discounts=torch.cat([first.discounts.float(), second.discounts.float()]),
        bootstrap=torch.cat([first.bootstrap.bool(), second.bootstrap.bool()]),
        next_obs=kind.cat([first.next_obs, second.next_obs]),
    )
