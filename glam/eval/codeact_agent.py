"""A policy trained with RL-GPT's coded actions (`glam.codeact`) as an agent of the evaluation
harness: it plays envs whose actions are the primitive ones and the coded actions its checkpoint
was trained with (`glam.codeact.env.CodedActionsEnv`, their code run in a sandbox process), and
reports how it used them beside success.

`agent.kind=checkpoint` of a run trained with `codeact.chooser` other than `none` gives this
agent: the coded actions are those of the run's iteration whose action set the checkpoint's
policy has (`<run folder>/codeact/iteration_<k>.json`), with the run's sandbox limits.

Figures, per episode in episodes.jsonl and summed over a suite: `codeact/decisions`,
`codeact/coded` (decisions that ran a coded action), `codeact/frames` (primitive steps: a coded
action counts the steps it took), `codeact/failed` (coded executions that failed); per suite
`codeact/coded_share` and `codeact/frames_per_episode`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from glam.codeact.config import CodeactConfig
from glam.codeact.critic import load_iterations
from glam.codeact.env import CodedActionsEnv, open_sandbox
from glam.codeact.sandbox import Sandbox
from glam.eval.agents import ActRequest, Agent, Decision
from glam.eval.stats import EpisodeResult
from glam.policy.files import CheckpointError

__all__ = ["CodeactAgent", "run_coded_actions"]

_COUNTS = ("decisions", "coded", "frames", "failed")


def run_coded_actions(
    policy_folder: Path, action_words: Sequence[str]
) -> tuple[CodeactConfig, dict[str, str]] | None:
    """The `codeact` settings and coded actions (name -> source, in the policy's order) of the
    run that trained the policy in `policy_folder`; None if its run had no coded actions.

    Raises:
        CheckpointError: the run had coded actions, but no iteration saved beside it has the
            policy's (a policy folder copied on its own, a run folder without `codeact/`).
    """
    checkpoint = policy_folder.parent
    run_config = checkpoint / "config.yaml"
    section = OmegaConf.load(run_config).get("codeact") if run_config.is_file() else None
    if section is None or section.get("chooser", "none") == "none":
        return None
    try:
        cfg = CodeactConfig(**OmegaConf.to_container(section, resolve=True))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{run_config}: unusable codeact settings: {error}") from None
    folder = checkpoint.parent.parent / "codeact"  # <run>/checkpoints/update_k/policy
    coded = list(action_words)[-cfg.num_actions :]
    matching = [it for it in load_iterations(folder) if list(it.sources) == coded]
    if not matching:
        raise CheckpointError(
            f"{policy_folder} was trained with coded actions {coded}, but no iteration saved in "
            f"{folder} has them: give agent.path the run or checkpoint folder it was saved in"
        )
    return cfg, dict(matching[-1].sources)


class CodeactAgent(Agent):
    """`policy` playing envs with the coded actions `coded` (module docstring)."""

    def __init__(self, policy: Agent, cfg: CodeactConfig, coded: dict[str, str]) -> None:
        self.policy = policy
        self.name = policy.name
        self.prompt_format = policy.prompt_format
        self.cfg = cfg
        self.coded = dict(coded)
        self._sandbox: Sandbox | None = None

    def new_history(self, nbr_obs: int):  # noqa: ANN201 (the inner agent's history)
        return self.policy.new_history(nbr_obs)

    def wrap_env(self, env: Any) -> CodedActionsEnv:
        if self._sandbox is None:
            self._sandbox = open_sandbox(env.action_words, self.cfg)
        return CodedActionsEnv(
            env,
            self.coded,
            self._sandbox,
            max_steps_per_action=self.cfg.max_steps_per_action,
        )

    def act(self, request: ActRequest) -> list[Decision]:
        return self.policy.act(request)

    def episode_figures(self, env: CodedActionsEnv) -> dict[str, float]:
        return {f"codeact/{name}": float(env.episode_counts[name]) for name in _COUNTS}

    def suite_figures(self, episodes: Sequence[EpisodeResult]) -> dict[str, float]:
        totals = {name: sum(e.figures[f"codeact/{name}"] for e in episodes) for name in _COUNTS}
        nan = float("nan")
        return {
            **{f"codeact/{name}": value for name, value in totals.items()},
            "codeact/coded_share": (
                totals["coded"] / totals["decisions"] if totals["decisions"] else nan
            ),
            "codeact/frames_per_episode": totals["frames"] / len(episodes) if episodes else nan,
        }

    def close(self) -> None:
        self.policy.close()
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None
