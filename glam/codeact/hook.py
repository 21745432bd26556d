"""RL-GPT joined to the PPO trainer: coded actions in the policy's action set, the outer loop
at phase boundaries (`codeact.*`, docs/rlgpt.md).

- The policy is built over the primitive actions and `codeact.num_actions` coded-action slots
  (`policy_factory`): the first iteration is chosen and written before it (on the main
  process, then handed to the others).
- Every local env becomes a `CodedActionsEnv` over one sandbox per process (`wrap_env`).
- After the update that brings the run's frames to the end of a phase, the statistics of every
  env of every process are summed, the critic reviews them, the slow and fast agents make the
  next iteration's set, and every process gives its envs, its runner and its policy the new
  actions; a slot whose action changed has its output reset (`reset_action_outputs`, when the
  policy has it: the symbolic network; a language model scores the new name as text). The
  checkpoint written after that update holds the new action words.
- Each iteration is saved in `<run folder>/codeact/iteration_<k>.json` when it begins and again
  when it is reviewed (the last one at the end of the run). A resumed run takes the iteration
  whose actions the checkpoint's policy has (the statistics of a phase count from the resume).
- Metrics (`codeact/`): the iteration the update's rollout played, the share of its decisions
  that ran a coded action, primitive frames per decision, the share of coded executions that
  failed, and the slots changed after it (at a phase boundary).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list, gather_object

from glam.baselines.run_config import BaselineRunConfig
from glam.baselines.symbolic import SymbolicActorCritic
from glam.codeact.chat_critic import ChatCritic
from glam.codeact.config import CodeactConfig
from glam.codeact.critic import (
    Critic,
    CriticRules,
    Decision,
    Iteration,
    load_iterations,
    total_stats,
)
from glam.codeact.env import CodedActionsEnv, open_sandbox
from glam.codeact.loop import OuterLoop, slot_changes
from glam.codeact.planner import (
    ActionChooser,
    ChatChooser,
    FixedChooser,
    RandomChooser,
    ScoredChooser,
    sample_family,
)
from glam.codeact.sandbox import Sandbox
from glam.codeact.writer import ActionWriter, ChatWriter, LibraryWriter
from glam.envs import resolve_action_space
from glam.llm.config import ClientConfig
from glam.llm.remote import OpenAIChatClient
from glam.models.loading import ModelNotFoundError
from glam.policy.files import env_record
from glam.policy.llm_policy import LLMActorCritic
from glam.ppo.hooks import HookError, TrainerHook
from glam.ppo.setup import PolicyFactory
from glam.runs.errors import SetupError
from glam.teach.scorers import build_scorer

if TYPE_CHECKING:
    from glam.ppo.setup import Training

__all__ = ["CodeactHook"]


class CodeactHook(TrainerHook):
    """RL-GPT's coded actions and outer loop in a PPO run (see the module docstring)."""

    def __init__(self, codeact: CodeactConfig, cfg: BaselineRunConfig) -> None:
        self.cfg = codeact
        self.run_cfg = cfg
        self.folder = Path(cfg.train.output_dir or ".") / "codeact"
        self.phase_frames = self.cfg.phase_frames or max(
            1, cfg.train.total_frames // self.cfg.iterations
        )
        self.iteration: Iteration | None = None
        self.primitives: list[str] = []
        self.envs: list[CodedActionsEnv] = []
        self.sandbox: Sandbox | None = None
        self.loop: OuterLoop | None = None
        self._closers: list[Callable[[], None]] = []
        self._chat: OpenAIChatClient | None = None
        self._counted = (0, 0, 0)  # coded uses, failed uses, coded frames at the last update
        self._changed = 0

    # ---- the policy and the envs --------------------------------------------------------------

    def policy_factory(self, default: PolicyFactory) -> PolicyFactory:
        """The run's `PolicyFactory`: `default`'s network over the primitive actions and the
        first iteration's coded actions, or the checkpoint's (whose iteration is then found)."""

        def build(cfg: BaselineRunConfig, checkpoint: Path | None) -> torch.nn.Module:
            try:
                primitives = _primitive_words(cfg)
            except ValueError as error:  # an unknown action space
                raise SetupError(str(error)) from None
            if checkpoint is not None:
                policy = default(cfg, checkpoint)
                self._resume(primitives, list(policy.action_words))
                return policy
            try:
                self._first_iteration(primitives)
            except ValueError as error:
                raise SetupError(f"codeact: {error}") from None
            words = self.action_words
            if cfg.policy.kind == "symbolic":
                policy = SymbolicActorCritic(cfg.symbolic, words)
                policy.training_env = env_record(cfg.env)
                return policy
            try:
                return LLMActorCritic.from_config(
                    cfg.model, cfg.policy, words, training_env=cfg.env
                )
            except ModelNotFoundError as error:
                raise SetupError(
                    f"model.name_or_path={cfg.model.name_or_path!r}: {error}"
                ) from None

        return build

    @property
    def action_words(self) -> list[str]:
        """The primitive actions, then the current iteration's coded actions (slot order)."""
        return [*self.primitives, *self.iteration.sources]

    def wrap_env(self, env: Any) -> Any:
        if self.iteration is None:
            raise HookError("codeact: the envs were built before the policy (no action set yet)")
        if self.sandbox is None:
            self.sandbox = open_sandbox(env.action_words, self.cfg)
        wrapped = CodedActionsEnv(
            env,
            dict(self.iteration.sources),
            self.sandbox,
            max_steps_per_action=self.cfg.max_steps_per_action,
        )
        self.envs.append(wrapped)
        return wrapped

    # ---- the outer loop -----------------------------------------------------------------------

    def _first_iteration(self, primitives: list[str]) -> None:
        """Choose and write iteration 0 on the main process; every process gets it."""
        self.primitives = primitives
        problem, record = None, None
        if _is_main():
            try:
                self.loop = self._build_loop()
                record = asdict(self.loop.begin(start_frames=0))
            except Exception as error:  # every process must hear of it (a server down...)
                problem = str(error)
        shared = [problem, record]
        broadcast_object_list(shared)
        if shared[0] is not None:
            raise ValueError(shared[0])
        self.iteration = _iteration(shared[1])

    def _resume(self, primitives: list[str], words: list[str]) -> None:
        """The iteration whose actions the checkpoint's policy has (the newest such)."""
        self.primitives = primitives
        coded = words[len(primitives) :]
        saved = load_iterations(self.folder)
        matching = [it for it in saved if list(it.sources) == coded]
        if words[: len(primitives)] != primitives or not matching:
            raise SetupError(
                f"codeact: cannot resume: no iteration saved in {self.folder} has the "
                f"checkpoint's actions {coded}"
            )
        self.iteration = matching[-1]
        if _is_main():
            self.loop = self._build_loop()
            self.iteration.stats, self.iteration.decisions = {}, {}
            self.loop.restore(saved[: saved.index(self.iteration) + 1])
            self.iteration.end_frames = None

    def _build_loop(self) -> OuterLoop:

        cfg, run = self.cfg, self.run_cfg
        family = sample_family(run.env.name, cfg.family_episodes, seed=run.train.seed)
        rules = CriticRules(max_failure_rate=cfg.max_failure_rate, min_uses=cfg.min_uses)
        critic = (
            ChatCritic(self._chat_client(), family, seed=run.train.seed)
            if cfg.critic == "chat"
            else Critic()
        )
        return OuterLoop(
            family,
            self._chooser(),
            self._writer(),
            cfg.num_actions,
            rules=rules,
            folder=self.folder,
            critic=critic,
        )

    def _chooser(self) -> ActionChooser:

        if self.cfg.chooser == "random":
            return RandomChooser(self.run_cfg.train.seed)
        if self.cfg.chooser == "fixed":
            return FixedChooser(self.cfg.actions)
        if self.cfg.chooser == "chat":
            return ChatChooser(self._chat_client(), seed=self.run_cfg.train.seed)

        scorer = build_scorer(self.cfg, "codeact")
        self._closers.append(getattr(scorer, "close", lambda: None))
        return ScoredChooser(scorer)

    def _writer(self) -> ActionWriter:

        if self.cfg.writer == "chat":
            return ChatWriter(self._chat_client(), seed=self.run_cfg.train.seed)
        return LibraryWriter()

    def _chat_client(self) -> OpenAIChatClient:
        """The one client of `codeact.base_url`, shared by the chooser, the writer and the
        critic that ask it (created at the first ask, closed with the hook)."""
        if self._chat is not None:
            return self._chat
        client = OpenAIChatClient(
            ClientConfig(
                backend="openai",
                base_url=self.cfg.base_url,
                model_id=self.cfg.model_id,
                temperature=self.cfg.temperature,
                max_tokens=self.cfg.max_tokens,
                timeout=self.cfg.timeout,
                max_retries=self.cfg.max_retries,
            )
        )
        self._closers.append(client.close)
        self._chat = client
        return client

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        frames = training.state.frames
        figures = self._figures(training)
        last = frames >= self.run_cfg.train.total_frames
        index = self.iteration.index
        boundary = index + 1 < self.cfg.iterations and frames >= (index + 1) * self.phase_frames
        figures["codeact/iteration"] = float(index)  # the one this update's rollout played
        self._changed = 0
        if last or boundary:
            self._review(training, frames, begin_next=boundary and not last)
        figures["codeact/slots_changed"] = float(self._changed)
        return figures

    def _figures(self, training: Training) -> dict[str, float]:
        """This update's decisions: coded share, frames per decision, coded failures."""
        uses = sum(entry.uses for env in self.envs for entry in env.stats.values())
        failed = sum(entry.outcomes["failed"] for env in self.envs for entry in env.stats.values())
        coded_frames = sum(
            entry.primitive_steps for env in self.envs for entry in env.stats.values()
        )
        before = self._counted
        self._counted = (uses, failed, coded_frames)
        decisions = training.cfg.ppo.frames_per_env * len(self.envs)
        local = [uses - before[0], failed - before[1], coded_frames - before[2], decisions]
        totals = training.accelerator.reduce(
            torch.tensor(local, dtype=torch.float64, device=training.accelerator.device), "sum"
        ).tolist()
        uses, failed, coded_frames, decisions = totals
        frames = decisions - uses + coded_frames
        nan = float("nan")
        return {
            "codeact/coded_share": uses / decisions,
            "codeact/frames_per_decision": frames / decisions,
            "codeact/failure_rate": failed / uses if uses else nan,
        }

    def _review(self, training: Training, frames: int, *, begin_next: bool) -> None:
        """The critic's review of the phase and, if another phase follows, the next action
        set, on every process (collective)."""
        local = total_stats(env.pop_stats() for env in self.envs)
        self._counted = (0, 0, 0)
        everyone = total_stats(gather_object([local]))
        problem, record = None, None
        if _is_main():
            try:
                feedback = self.loop.review(everyone, end_frames=frames)
                if begin_next:
                    record = asdict(self.loop.begin(start_frames=frames, feedback=feedback))
            except Exception as error:  # a server that fails, a writer that cannot fill
                problem = f"codeact: the outer loop failed at frame {frames}: {error}"
        shared = [problem, record]
        broadcast_object_list(shared)
        if shared[0] is not None:
            raise HookError(shared[0])
        if shared[1] is not None:
            self._apply(training, _iteration(shared[1]))

    def _apply(self, training: Training, iteration: Iteration) -> None:
        before = list(self.iteration.sources)
        self.iteration = iteration
        for env in self.envs:
            env.set_coded(dict(iteration.sources))
        training.runner.set_action_words(self.action_words)
        policy = training.accelerator.unwrap_model(training.model)
        policy.action_words = self.action_words
        changed = slot_changes(before, list(iteration.sources))
        if changed and hasattr(policy, "reset_action_outputs"):
            policy.reset_action_outputs([len(self.primitives) + i for i in changed])
        self._changed = len(changed)

    def close(self) -> None:
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None
        for close in self._closers:
            close()
        self._closers = []
        self._chat = None


def _primitive_words(cfg: BaselineRunConfig) -> list[str]:
    return list(resolve_action_space(cfg.env.action_space).words)


def _iteration(record: dict[str, Any]) -> Iteration:
    record = dict(record)
    record["decisions"] = {name: Decision(**d) for name, d in record["decisions"].items()}
    return Iteration(**record)


def _is_main() -> bool:
    return PartialState().is_main_process
