"""The local environments, each with its prompt history: observations in, actions out.

`EnvRunner` turns `babyai_text.TextVectorEnv` into what a policy needs at each step: for a
text policy one prompt and one candidate list per env, for a grid policy minigrid's symbolic
view and the mission (`glam.policy.observations`). It applies the chosen actions, keeps the
histories in step with same-step auto-reset, and reports the episodes that ended. The trainers
and evaluation alike play their episodes through it; `env_seed` lays out a training run's
episode seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from babyai_text import ActionSpace, TextEnv, TextVectorEnv
from glam.config import EnvConfig, PolicyConfig
from glam.demos import DemoRecord
from glam.policy.observations import GridObservations, Observations, TextObservations
from glam.policy.prompts import PromptHistory

if TYPE_CHECKING:  # the grid policies' runner stays free of the language-model stack
    from transformers import PreTrainedTokenizerBase

SEEDS_PER_RANK = 1_000_000
"""Episode seeds reserved for each process: rank r of run seed s plays seeds from
`s * 10**8 + r * 10**6` up (env i's n-th episode: `+ i + n * local_num_envs`). With
`train.seed < glam.config.MAX_RUN_SEED` and at most `MAX_PROCESSES` processes, every training
seed is below 10**12, where evaluation seeds start (`glam.eval.config.SEED_BASE`)."""
MAX_PROCESSES = 100
"""Processes one run can have: each takes 10**6 of the run's 10**8 seeds."""


def resolve_action_space(name: str) -> ActionSpace:
    """The action space called `name` in `babyai_text` (ValueError listing the known ones)."""
    from babyai_text import get_action_space

    return get_action_space(name)


def env_seed(run_seed: int, rank: int) -> int:
    """Base episode seed of the environments of process `rank` in a run seeded `run_seed`."""
    return run_seed * 100 * SEEDS_PER_RANK + rank * SEEDS_PER_RANK


def record_episode(
    env: TextEnv,
    choose: Callable[[int], int | None],
    *,
    level: str,
    seed: int,
    episode: int,
    nbr_obs: int,
    prompt_format: str = "glam",
    tokenizer: PreTrainedTokenizerBase | None = None,
    source: str = "bot",
) -> tuple[list[DemoRecord], bool]:
    """Play one episode of `env` from `env.reset(seed=seed)` and record each decision with the
    prompt the policy would have read there (`PromptHistory`, `nbr_obs` observations).

    `choose(step)` gives each step's action index, read after the env reached that step (a
    planner may look at `env`), or None to stop before the episode ends. `prompt_format` and
    `tokenizer` are those of `PromptHistory.prompt`.

    Returns:
        The decisions, in step order, and whether the episode ended in success.
    """
    obs, info = env.reset(seed=seed)
    history = PromptHistory(nbr_obs)
    history.reset()
    history.add_observation(info["descriptions"])
    mission, task_type = obs["mission"], info.get("task_type")
    space = env.action_space_def
    decisions: list[tuple[str, int]] = []
    success = False
    while (index := choose(len(decisions))) is not None:
        prompt = history.prompt(
            mission,
            env.action_words,
            env.language,
            prompt_format=prompt_format,
            tokenizer=tokenizer,
        )
        decisions.append((prompt, index))
        obs, _, terminated, truncated, info = env.step(index)
        history.add_action(space.words[index])
        if terminated or truncated:
            success = bool(info["success"])
            break
        history.add_observation(info["descriptions"])
    records = [
        DemoRecord(
            prompt=prompt,
            action=space.words[index],
            action_index=index,
            action_space=space.name,
            mission=mission,
            task_type=task_type,
            level=level,
            episode=episode,
            seed=seed,
            step=step,
            success=success,
            source=source,
        )
        for step, (prompt, index) in enumerate(decisions)
    ]
    return records, success


class EnvRunner:
    """`num_envs` BabyAI-Text environments and their prompt histories."""

    def __init__(
        self,
        env_cfg: EnvConfig,
        policy_cfg: PolicyConfig,
        *,
        num_envs: int,
        seed: int,
        tokenizer: Any = None,
        observation_kind: str = "text",
        wrap_env: Callable[[Any], Any] | None = None,
        group_size: int = 1,
    ) -> None:
        """
        Args:
            env_cfg: level, history length, action space, language.
            policy_cfg: the prompt format (`glam` or `chat`).
            num_envs: environments stepped by this process.
            seed: base of the episode seed schedule (see `env_seed`).
            tokenizer: the model's tokenizer, for the `chat` prompt format.
            observation_kind: what `observations()` returns: `text` (prompts and candidates)
                or `grid` (minigrid's symbolic view and the mission).
            wrap_env: applied to every env once made (`babyai_text.TextVectorEnv`'s
                `wrapper`): a coupling's env with other actions, rewards or observations.
            group_size: envs per group playing the same episode seeds (GRPO, GiGPO:
                `babyai_text.TextVectorEnv`'s groups); with more than 1, every rollout starts
                the envs on new episodes (`begin_rollout`).
        """
        if observation_kind not in ("text", "grid"):
            raise ValueError(f"observation_kind={observation_kind!r} is not 'text' or 'grid'")
        self.observation_kind = observation_kind
        self.envs = TextVectorEnv(
            env_cfg.name,
            num_envs,
            seed=seed,
            action_space=self._action_space(env_cfg),
            language=env_cfg.language,
            wrapper=wrap_env,
            group_size=group_size,
        )
        self.group_size = group_size
        self._stepped = False
        """A step was taken since the last `reset` (`begin_rollout` then starts new episodes)."""
        self.num_envs = num_envs
        self.language = env_cfg.language
        self.action_words: list[str] = list(self.envs.action_words)
        self.histories = [PromptHistory(env_cfg.nbr_obs) for _ in range(num_envs)]
        self._prompt_format = policy_cfg.prompt_format
        self._elapsed = policy_cfg.value_time
        """Give the policy each episode's elapsed time (`policy.value_time`)."""
        self._tokenizer = tokenizer
        self.missions: list[str] = [""] * num_envs
        self._level, self._action_space = env_cfg.name, env_cfg.action_space
        self.recording = False
        """Keep every decision (prompt, action) of the episodes played, for `pop_records`."""
        self._pending: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]
        self._records: list[dict[str, Any]] = []
        self._observations: list[dict[str, Any]] = [{} for _ in range(num_envs)]
        """The current minigrid observation of each env (the grid policy's input)."""
        self.final_prompts: list[str | None] = [None] * num_envs
        """Per env, after `step`: the prompt of the final observation of an episode that the
        time limit cut at that step (to bootstrap its value), else None."""
        self._final_observations: list[dict[str, Any] | None] = [None] * num_envs
        self.seen: list[list[str]] = [[] for _ in range(num_envs)]
        """Per env, after `step`: the descriptions of what it saw after its action (its
        episode's final view where the episode ended), hindsight relabelling's input."""

    def _action_space(self, env_cfg: EnvConfig) -> ActionSpace:
        """The action space the envs are made with (`env.action_space`)."""
        return resolve_action_space(env_cfg.action_space)

    def reset(self) -> None:
        """Start a new episode in every env (at the next seeds of the schedule)."""
        self._stepped = False
        observations, infos = self.envs.reset()
        self._pending = [[] for _ in range(self.num_envs)]  # episodes cut short are not kept
        for i, (obs, info) in enumerate(zip(observations, infos, strict=True)):
            self._start_history(i, obs, info)

    def _start_history(self, i: int, obs: dict[str, Any], info: dict[str, Any]) -> None:
        self.histories[i].reset()
        self.histories[i].add_observation(info["descriptions"])
        self.missions[i] = obs["mission"]
        self._observations[i] = obs

    def begin_rollout(self) -> None:
        """Called at the start of every rollout. Episodes go on from one rollout to the next,
        except with groups (`group_size` > 1): a group estimator compares whole episodes of the
        same seeds, so every rollout starts every env on a new episode, in step with its group."""
        if self.group_size > 1 and self._stepped:
            self.reset()

    def rollout_metrics(self, accelerator: Any) -> dict[str, float]:
        """Metrics of the rollout just collected, over every process (collective where not
        empty); none here. A runner whose policy writes its answers reports them
        (`glam.ppo.written`)."""
        return {}

    @property
    def frames(self) -> int:
        """Primitive steps the envs took so far (a coded action's count as many as it took)."""
        return self.envs.frames

    def set_action_words(self, words: Sequence[str]) -> None:
        """The envs' actions changed (a coupling's new coded actions): prompts and candidates
        name these from now on."""
        self.action_words = list(words)
        self.envs.action_words = tuple(words)

    def prompts(self) -> list[str]:
        """The current prompt of every env."""
        return [self._prompt(i) for i in range(self.num_envs)]

    def _prompt(self, i: int) -> str:
        return self.histories[i].prompt(
            self.missions[i],
            self.action_words,
            self.language,
            prompt_format=self._prompt_format,
            tokenizer=self._tokenizer,
        )

    def candidates(self) -> list[list[str]]:
        """The action strings each env's policy chooses among."""
        return [self.action_words] * self.num_envs

    def observations(self) -> Observations:
        """What the policy reads in every env now."""
        if self.observation_kind == "grid":
            return GridObservations.from_minigrid(self._observations)
        elapsed = None
        if self._elapsed:
            elapsed = [self._elapsed_share(env) for env in self.envs.envs]
        return TextObservations(self.prompts(), self.candidates(), elapsed=elapsed)

    @staticmethod
    def _elapsed_share(env: Any) -> float:
        """The share of its time limit the env's current episode has used (minigrid's
        `step_count / max_steps`)."""
        base = env.unwrapped
        return base.step_count / base.max_steps

    def final_observations(self) -> tuple[list[int], Observations | None]:
        """After `step`: the envs whose episode the time limit cut at that step, and what the
        policy would read in their final state (to bootstrap its value); `([], None)` if none."""
        envs = [i for i, prompt in enumerate(self.final_prompts) if prompt is not None]
        if not envs:
            return [], None
        if self.observation_kind == "grid":
            return envs, GridObservations.from_minigrid([self._final_observations[i] for i in envs])
        # The time limit cut them: their final state has used all of it.
        return envs, TextObservations(
            [self.final_prompts[i] for i in envs],
            [self.action_words] * len(envs),
            elapsed=[1.0] * len(envs) if self._elapsed else None,
        )

    def step(
        self, actions: list[int]
    ) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any] | None]]:
        """Apply one action per env.

        Returns:
            `(rewards, dones, episodes)`: BabyAI rewards and episode-ended flags `(envs,)`, and
            per env the stats of the episode that just ended (None if it goes on). Ended envs
            have already started their next episode, with a fresh history.
        """
        self._stepped = True
        if self.recording:
            for i, (prompt, action) in enumerate(zip(self.prompts(), actions, strict=True)):
                self._pending[i].append({"prompt": prompt, "action_index": int(action)})
        observations, rewards, terminated, truncated, infos = self.envs.step(actions)
        dones = terminated | truncated
        episodes: list[dict[str, Any] | None] = []
        self.final_prompts = [None] * self.num_envs
        self._final_observations = [None] * self.num_envs
        for i, (obs, info) in enumerate(zip(observations, infos, strict=True)):
            self.seen[i] = list((info["final_info"] if dones[i] else info)["descriptions"])
            if truncated[i] and not terminated[i]:
                self.histories[i].add_action(self.action_words[actions[i]])
                self.histories[i].add_observation(info["final_info"]["descriptions"])
                self.final_prompts[i] = self._prompt(i)
                self._final_observations[i] = info["final_obs"]
            if dones[i]:
                episodes.append(info["episode"])
                if self.recording:
                    self._finish_episode(i, info["episode"])
                self._start_history(i, obs, info)
            else:
                episodes.append(None)
                self.histories[i].add_action(self.action_words[actions[i]])
                self.histories[i].add_observation(info["descriptions"])
                self._observations[i] = obs
        return rewards, dones, episodes

    def _finish_episode(self, i: int, episode: dict[str, Any]) -> None:
        """Turn env i's decisions into rows of the demonstrations format (`glam.demos`)."""
        for step, decision in enumerate(self._pending[i]):
            self._records.append(
                {
                    **decision,
                    "action": self.action_words[decision["action_index"]],
                    "action_space": self._action_space,
                    "mission": episode["mission"],
                    "task_type": episode["task_type"] or "",
                    "level": self._level,
                    "episode": episode["seed"],  # unique within a run: one episode per seed
                    "seed": episode["seed"],
                    "step": step,
                    "success": bool(episode["success"]),
                    "source": "ppo",
                }
            )
        self._pending[i] = []

    def pop_records(self) -> list[dict[str, Any]]:
        """The decisions of the episodes finished since the last call (with `recording` on)."""
        records, self._records = self._records, []
        return records

    def state_dict(self) -> dict[str, Any]:
        """The seed schedule, to resume with the next episodes."""
        return self.envs.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the seed schedule; call `reset()` next."""
        self.envs.load_state_dict(state)

    def close(self) -> None:
        """Close the environments."""
        self.envs.close()
