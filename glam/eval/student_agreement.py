"""How often a student's most probable action is BabyAI's bot's, on episodes it plays itself.

The trainer's `teach/agreement` is measured on each update's own minibatches: the states the
student is being fitted to, an in-sample figure. This is the held-out one: fresh episodes (seeds
from `glam.eval.config.SEED_BASE`, the evaluation harness's, never a training run's), the student
acting on its own (actions sampled from its policy, or greedy), and the bot advising on every
state as it does while teaching (`BotTeacher`: it replans after the student's actual action).

The counts are also split by whether the agent sees an object its mission names (`mission_in_view`):
with the object in view the bot's next step follows from the view alone; without it the bot
explores from the map it has kept of the cells seen so far, which a student without memory cannot
know.

    python scripts/bot_agreement.py runs/teach_run --level BabyAI-GoToLocal-v0 --envs 20 --steps 100
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from glam.config import EnvConfig, PolicyConfig
from glam.envs import EnvRunner
from glam.eval.config import SEED_BASE
from glam.eval.stats import wilson_interval
from glam.policy.observations import new_episodes_forget, policy_inputs
from glam.teach.teacher import BotTeacher

__all__ = ["StudentAgreement", "mission_in_view", "student_agreement"]


def mission_in_view(env: Any) -> bool | None:
    """Whether the agent sees (in its view, not hidden behind a wall) an object its mission names;
    None for a mission that names no single object description (`PutNext`, `And`, `Before`, ...).

    `env`: a minigrid BabyAI env (or a wrapper of one) after `reset`."""
    base = env.unwrapped
    description = getattr(base.instrs, "desc", None)
    if description is None:
        return None
    _, visible = base.gen_obs_grid()
    for x, y in description.obj_poss:
        coordinates = base.relative_coords(x, y)
        if coordinates is not None and visible[coordinates]:
            return True
    return False


@dataclass(frozen=True)
class StudentAgreement:
    """Counts over the states of the played episodes."""

    agree: int
    """States where the student's most probable action is the bot's."""
    advised: int
    """States where the bot advised an action of the student's space (it may advise none: an
    action outside the space, `done`, or no plan)."""
    states: int
    """States played (envs x steps)."""
    episodes: int
    """Episodes that ended during the play."""
    successes: int
    """Of which succeeded."""
    agree_in_view: int = 0
    """`agree`, on the states where the agent sees an object its mission names."""
    advised_in_view: int = 0
    """`advised`, on those states (`mission_in_view`); the rest are the states without it (or
    with a mission naming no single object)."""

    @property
    def rate(self) -> float:
        return self.agree / self.advised if self.advised else float("nan")

    @property
    def interval(self) -> tuple[float, float]:
        """95% Wilson interval of `rate` (states are not independent within an episode: a
        guide, narrower than the truth)."""
        return wilson_interval(self.agree, self.advised)

    @property
    def rate_in_view(self) -> float:
        """`rate` on the states where the mission's object is in view."""
        return self.agree_in_view / self.advised_in_view if self.advised_in_view else float("nan")

    @property
    def rate_out_of_view(self) -> float:
        """`rate` on the other states."""
        advised = self.advised - self.advised_in_view
        return (self.agree - self.agree_in_view) / advised if advised else float("nan")

    @property
    def success_rate(self) -> float:
        return self.successes / self.episodes if self.episodes else float("nan")


@torch.no_grad()
def student_agreement(
    policy: torch.nn.Module,
    env_cfg: EnvConfig,
    policy_cfg: PolicyConfig,
    *,
    num_envs: int = 8,
    steps: int = 48,
    seed: int = SEED_BASE,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> StudentAgreement:
    """Play `steps` steps of `num_envs` envs of `env_cfg`'s level with `policy` (actions sampled,
    or its argmax with `greedy`); count the states where its argmax is the bot's advice.

    `policy`: any policy of the trainer whose observations the runner builds (`observation_kind`
    `grid` or `text` with the `glam` prompt format); a policy with memory carries it per env,
    zero at each episode's start, as in training.
    """
    runner = EnvRunner(
        env_cfg,
        policy_cfg,
        num_envs=num_envs,
        seed=seed,
        observation_kind=getattr(policy, "observation_kind", "text"),
    )
    try:
        runner.reset()
        teacher = BotTeacher(runner.envs.envs[0].action_space_def.minigrid_actions)
        size = getattr(policy, "memory_size", 0)
        memory = torch.zeros(num_envs, size) if size else None
        new_episode = [True] * num_envs
        agree = advised = episodes = successes = agree_in_view = advised_in_view = 0
        for _ in range(steps):
            probs, valid = teacher.distributions(runner.envs.envs, range(num_envs), new_episode)
            output = policy(**policy_inputs(runner.observations(), memory))
            best = output.logits.argmax(-1).cpu()
            if greedy:
                actions = best
            else:
                actions = torch.multinomial(output.dist.probs.cpu(), 1, generator=generator)[:, 0]
            agreed = (best == probs.argmax(-1)) & valid
            in_view = torch.tensor([bool(mission_in_view(env)) for env in runner.envs.envs])
            agree += int(agreed.sum())
            advised += int(valid.sum())
            agree_in_view += int((agreed & in_view).sum())
            advised_in_view += int((valid & in_view).sum())
            teacher.record_actions(range(num_envs), actions.tolist())
            _, dones, ended = runner.step(actions.tolist())
            new_episode = [bool(done) for done in dones]
            if memory is not None:
                memory = new_episodes_forget(output.memory.cpu(), dones)
            for episode in ended:
                if episode is not None:
                    episodes += 1
                    successes += int(bool(episode["success"]))
    finally:
        runner.close()
    return StudentAgreement(
        agree,
        advised,
        num_envs * steps,
        episodes,
        successes,
        agree_in_view,
        advised_in_view,
    )
