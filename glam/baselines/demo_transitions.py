"""Demonstrations as DRRN's transitions, for learning from them as DQfD does (Hester et al.
2018; `drrn.demos`).

A demonstrations dataset (`glam.demos`) keeps each decision's prompt and action, not its reward
or what followed. Each demonstrated episode is therefore replayed: its env reset with its seed
and stepped with its recorded actions, in the run's own prompt format (its `env.nbr_obs`, its
language), which gives every step's transition as the agent's own are stored
(`glam.baselines.replay.ReplayBuffer`): prompt, candidates, action, scaled reward, the next
prompt (a time-out's final one) and whether the episode terminated there. A replay that does not
show what the recorded prompt shows (another level, action space or version of the env) is
refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from glam.baselines.config import DRRNConfig
from glam.baselines.replay import ReplayBuffer
from glam.config import EnvConfig
from glam.demos import DemoDatasetError, load_demos, replay_demonstrations, split_pairs
from glam.envs import resolve_action_space
from glam.policy.prompts import PromptHistory

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = ["demonstrated_transitions", "load_demo_transitions"]

NEEDED = ("level", "action_space", "episode", "seed", "step", "action_index", "mission", "prompt")


def load_demo_transitions(
    drrn: DRRNConfig, env: EnvConfig, prompt_format: str = "glam"
) -> tuple[ReplayBuffer, int]:
    """The transitions of `drrn.demos`' episodes that `drrn.demo_held_out` keeps (all of them
    at 0), and how many episodes they come from.

    Raises:
        DemoDatasetError: the folder is not a demonstrations dataset, or its episodes cannot be
            replayed for this run (the message says why).
    """
    pairs = load_demos(drrn.demos)
    if drrn.demo_held_out > 0:
        pairs, _ = split_pairs(pairs, drrn.demo_held_out, drrn.demo_split_seed)
    return demonstrated_transitions(pairs, env, prompt_format), len(set(pairs["episode"]))


def demonstrated_transitions(
    pairs: Dataset, env: EnvConfig, prompt_format: str = "glam"
) -> ReplayBuffer:
    """Every step of `pairs`' episodes as a transition of a run with the env settings `env` and
    `policy.prompt_format`, in a buffer holding exactly them (episode by episode, in step
    order).

    Raises:
        DemoDatasetError: a column is missing, the demonstrations are of another level or action
            space than `env`'s, or an episode cannot be replayed (`replay_demonstrations`).
    """
    missing = sorted(set(NEEDED) - set(pairs.column_names))
    if missing:
        raise DemoDatasetError(
            f"the demonstrations have no {missing} column: DRRN's transitions are found by "
            "replaying each episode from its seed"
        )
    levels, spaces = set(pairs["level"]), set(pairs["action_space"])
    if levels != {env.name} or spaces != {env.action_space}:
        raise DemoDatasetError(
            f"the demonstrations are of level {sorted(levels)} and action space {sorted(spaces)}; "
            f"this run plays {env.name} with env.action_space={env.action_space}"
        )
    words = list(resolve_action_space(env.action_space).words)
    rows = pairs.select_columns(list(NEEDED)).to_list()
    buffer = ReplayBuffer(max(1, len(rows)))
    history = PromptHistory(env.nbr_obs)

    def prompt(obs: dict[str, Any]) -> str:
        return history.prompt(obs["mission"], words, env.language, prompt_format=prompt_format)

    # Listed first: each step's outcome (`after`) is filled as the replay goes on.
    for step in list(replay_demonstrations(rows, env.name, env.action_space, env.language)):
        if rows[step.index]["step"] == 0:
            history.reset()
            history.add_observation(step.info["descriptions"])
        before = prompt(step.obs)
        action = rows[step.index]["action_index"]
        obs, reward, terminated, _, info = step.after  # type: ignore[misc]  # filled by now
        history.add_action(words[action])
        history.add_observation(info["descriptions"])
        buffer.add(
            [before],
            [words],
            torch.tensor([action]),
            torch.tensor([reward * env.reward_scale]),
            [prompt(obs)],
            [words],
            torch.tensor([terminated]),
        )
    return buffer
