"""N text envs stepped together, with automatic reset and a reproducible seed schedule.

Seed schedule: the n-th episode (n = 0, 1, ...) of env i is reset with seed
``seed + i + n * num_envs``. A run therefore plays the distinct seeds ``seed, seed + 1, ...``,
each once, in batches of ``num_envs``; two runs with the same base seed play the same episodes
(as long as the agent acts the same), and runs whose base seeds are far apart never share one.
``state_dict()`` saves how many episodes each env has started so that a resumed run goes on
with the next seeds instead of replaying the first ones.

Groups (``group_size=G``, for GRPO-like estimators): envs ``g*G .. g*G + G - 1`` form group g
and play the same seeds, ``seed + g + n * (num_envs / G)`` for their n-th episode, so each
episode of the group is played G times; ``reset()`` moves the envs of a group that fell behind
to the group's furthest episode first, so that after it the group's envs start the same one.
With G = 1 (the default) this is the schedule above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from babyai_text.env import TextEnv, make

__all__ = ["TextVectorEnv"]


class TextVectorEnv:
    """``num_envs`` copies of a BabyAI text env stepping in lockstep.

    ``step`` resets an env as soon as its episode ends (same-step auto-reset): the returned
    ``obs_list[i]`` and ``infos[i]`` are then those of the new episode, and ``infos[i]`` also
    holds

    - ``"episode"``: ``{"return", "length", "success", "seed", "mission", "task_type"}`` of the
      episode that just ended;
    - ``"final_obs"``, ``"final_info"``: its last observation and info (to bootstrap the value
      of a truncated episode).

    Frames are primitive steps: a step of an env whose ``info["primitive_steps"]`` says it took
    several (a coded action of ``glam.codeact``) counts that many, in ``frames`` and in the
    episode's ``"length"``; any other step counts one.
    """

    def __init__(
        self,
        level_id: str,
        num_envs: int,
        *,
        seed: int,
        wrapper: Callable[[TextEnv], Any] | None = None,
        group_size: int = 1,
        **make_kwargs: Any,
    ) -> None:
        """
        Args:
            level_id: any BabyAI level id, see :func:`babyai_text.make`.
            num_envs: number of envs.
            seed: base seed of the schedule (see the module docstring).
            wrapper: applied to every env once made; what it returns is stepped instead. It
                keeps :class:`TextEnv`'s interface (``action_words``, ``reset(seed=)``,
                ``step``, ``info["success"]`` and ``info["task_type"]``) and may change the
                actions, the rewards or the observations (a coupling's env, e.g. LLM4RL's
                mediator).
            group_size: envs per group playing the same seeds (see the module docstring); it
                divides ``num_envs``.
            **make_kwargs: passed to :func:`babyai_text.make` for every env.
        """
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        if group_size < 1 or num_envs % group_size:
            raise ValueError(f"group_size={group_size} must be >= 1 and divide num_envs={num_envs}")
        self.group_size = group_size
        self.num_envs = num_envs
        self.seed = int(seed)
        envs = [make(level_id, **make_kwargs) for _ in range(num_envs)]
        self.envs: list[TextEnv] = [wrapper(env) for env in envs] if wrapper else envs
        self.action_words: tuple[str, ...] = self.envs[0].action_words
        self.episodes_started = [0] * num_envs
        """Number of episodes each env has started; the next one uses the next seed."""
        self.frames = 0
        """Primitive steps taken by all the envs so far (see the class docstring)."""
        self._running: list[dict[str, Any]] | None = None  # per env: seed, return, length

    def episode_seed(self, env_index: int, episode: int) -> int:
        """Seed of episode ``episode`` (0, 1, ...) of env ``env_index``."""
        groups = self.num_envs // self.group_size
        return self.seed + env_index // self.group_size + episode * groups

    def reset(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Start a fresh episode in every env, each at its next seed (the envs of a group at
        the group's furthest: they start the same episode)."""
        if self.group_size > 1:
            for start in range(0, self.num_envs, self.group_size):
                furthest = max(self.episodes_started[start : start + self.group_size])
                self.episodes_started[start : start + self.group_size] = [
                    furthest
                ] * self.group_size
        self._running = [{} for _ in range(self.num_envs)]
        observations, infos = [], []
        for i in range(self.num_envs):
            obs, info = self._start_episode(i)
            observations.append(obs)
            infos.append(info)
        return observations, infos

    def step(
        self, actions: Sequence[int | str]
    ) -> tuple[list[dict[str, Any]], np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        """Take one action per env (an index into ``action_words`` or a word).

        Returns:
            ``(obs_list, rewards, terminated, truncated, infos)``; rewards float32, terminated
            and truncated bool, each of shape ``(num_envs,)``.
        """
        if self._running is None:
            raise RuntimeError("call reset() before step()")
        if len(actions) != self.num_envs:
            raise ValueError(f"expected {self.num_envs} actions, got {len(actions)}")
        observations, infos = [], []
        rewards = np.zeros(self.num_envs, dtype=np.float32)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            obs, reward, terminated[i], truncated[i], info = env.step(action)
            rewards[i] = reward
            running = self._running[i]
            frames = int(info.get("primitive_steps", 1))
            running["return"] += float(reward)
            running["length"] += frames
            self.frames += frames
            if terminated[i] or truncated[i]:
                episode = {
                    "return": running["return"],
                    "length": running["length"],
                    "success": info["success"],
                    "seed": running["seed"],
                    "mission": running["mission"],
                    "task_type": running["task_type"],
                }
                final_obs, final_info = obs, info
                obs, info = self._start_episode(i)
                info = {
                    **info,
                    "episode": episode,
                    "final_obs": final_obs,
                    "final_info": final_info,
                }
            observations.append(obs)
            infos.append(info)
        return observations, rewards, terminated, truncated, infos

    def _start_episode(self, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        seed = self.episode_seed(i, self.episodes_started[i])
        self.episodes_started[i] += 1
        obs, info = self.envs[i].reset(seed=seed)
        self._running[i] = {
            "seed": seed,
            "return": 0.0,
            "length": 0,
            "mission": obs["mission"],
            "task_type": info["task_type"],
        }
        return obs, info

    def state_dict(self) -> dict[str, Any]:
        """Plain data to resume the seed schedule: base seed and episodes started per env."""
        state = {
            "seed": self.seed,
            "num_envs": self.num_envs,
            "episodes_started": list(self.episodes_started),
        }
        if self.group_size > 1:  # another schedule: a resume must keep it
            state["group_size"] = self.group_size
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the seed schedule saved by :meth:`state_dict`.

        Episodes in progress are dropped: call :meth:`reset` next, which starts every env at its
        next seed.
        """
        if state.get("group_size", 1) != self.group_size:
            raise ValueError(
                f"state is for groups of {state.get('group_size', 1)} envs, this vector env has "
                f"groups of {self.group_size}"
            )
        if state["num_envs"] != self.num_envs:
            raise ValueError(
                f"state is for {state['num_envs']} envs, this vector env has {self.num_envs}"
            )
        episodes = [int(n) for n in state["episodes_started"]]
        if len(episodes) != self.num_envs or min(episodes) < 0:
            raise ValueError(f"bad episodes_started {state['episodes_started']!r}")
        self.seed = int(state["seed"])
        self.episodes_started = episodes
        self._running = None

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()
