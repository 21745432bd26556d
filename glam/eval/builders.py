"""Build the evaluated agent from its config: load models, pick the prompt format and protocol."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from peft import PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from glam.ask.config import AskConfig
from glam.ask.mediated import MEDIATOR_ACTIONS
from glam.baselines.loading import load_policy
from glam.devices import unusable_gpu
from glam.eval.agents import (
    Agent,
    BotAgent,
    ConstantAgent,
    FixedAgent,
    FormattedHistory,
    History,
    RandomAgent,
    ScoringAgent,
    SymbolicAgent,
)
from glam.eval.codeact_agent import CodeactAgent, run_coded_actions
from glam.eval.config import DEFAULT_NBR_OBS, AgentConfig, GenerationConfig
from glam.eval.generation import GenerationAgent
from glam.eval.mediator_agent import MediatorAgent
from glam.eval.teacher_agent import TeacherAgent
from glam.eval.writing_agent import WritingAgent
from glam.llm.chat import ChatClient
from glam.llm.config import ClientConfig
from glam.llm.local import LocalChatClient
from glam.llm.remote import OpenAIChatClient
from glam.models.loading import DTYPES, load_model
from glam.models.precision import use_tf32
from glam.policy.bc_policy import BCPolicyInfo, load_bc_policy, read_bc_policy_info
from glam.policy.files import CheckpointError, read_policy_config
from glam.policy.llm_policy import CONFIG_FILE, LLMActorCritic
from glam.policy.writer import WritingActorCritic
from glam.runs.folder import policy_dir
from glam.scoring import score_candidates
from glam.teach.config import TeachConfig
from glam.teach.hook import build_teacher
from glam.teach.scorers import LocalScorer

__all__ = ["agent_label", "build_agent", "resolve_device"]


def resolve_device(device: str) -> torch.device:
    """`auto` is CUDA when available, else the CPU. On a GPU that has them, fp32 matrix
    products run on TF32 tensor cores (`glam.models.precision.use_tf32`).

    Raises:
        ValueError: `auto` on a machine with a GPU that torch cannot use (`glam.devices`): the
            evaluation would run on the CPU without a word.
    """
    if device == "auto":
        if (problem := unusable_gpu("agent.device=cpu")) is not None:
            raise ValueError(f"agent.device=auto: {problem}")
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    use_tf32(resolved)
    return resolved


def agent_label(cfg: AgentConfig) -> str:
    """A short name for tables; the seeds of one training run share it (`glam_paper`)."""
    if cfg.kind in ("random", "bot"):
        return cfg.kind
    if cfg.kind == "constant":
        return f"constant:{cfg.action}"
    if cfg.kind == "fixed":
        return FixedAgent(cfg.probs).name
    if cfg.kind == "mediator":
        ask = cfg.ask
        rule = f"random(p={ask.probability:g})" if ask.mode == "random" else ask.mode
        return f"mediator:{rule}:{_planner_label(ask.planner, ask.model)}"
    if cfg.kind == "teacher":
        return f"teacher:{cfg.teacher}" + (f":{cfg.model}" if cfg.teacher == "llm" else "")
    if cfg.kind == "zero_shot":
        model = Path(cfg.model).name or cfg.model
        tempered = f" (T={cfg.temperature:g})" if cfg.temperature not in (None, 1.0) else ""
        return f"zero_shot-{cfg.protocol}:{model}{tempered}"
    # A trained folder played under BALROG's protocol is another agent than under its own.
    kind = f"{cfg.kind}-generation" if cfg.protocol == "generation" else cfg.kind
    path = Path(cfg.path).resolve()
    if path.parent.name == "checkpoints":  # a checkpoint folder: name its run
        path = path.parent.parent
    elif path.name == "policy" and path.parent.parent.name == "checkpoints":
        path = path.parent.parent.parent
    # Campaign runs are named `<grid point>_seed-<n>` (or `seed-<n>`) inside the campaign folder.
    name = re.sub(r"_?seed-\d+$", "", path.name)
    name = f"{path.parent.name}/{name}" if name else path.parent.name
    if cfg.planner is not None:  # a mediator played with another planner than its run's
        name = f"{name}:planner={_planner_label(cfg.planner, cfg.ask.model)}"
    return f"{kind}:{name}"


def _planner_label(planner: str, model: str) -> str:
    return f"llm:{Path(model).name or model}" if planner == "llm" else "bot"


def build_agent(
    cfg: AgentConfig,
    *,
    greedy: bool,
    generation: GenerationConfig | None = None,
    client: ClientConfig | None = None,
) -> Agent:
    """The agent `cfg` describes.

    Args:
        cfg: which agent.
        greedy: scoring protocol: take the best action instead of sampling.
        generation: generation protocol: BALROG's dialogue settings (None: the defaults).
        client: generation protocol: which model answers and how (None: the defaults, the
            agent's model in this process).

    Raises:
        FileNotFoundError: a checkpoint or BC folder that does not exist or is not one.
        glam.ModelNotFoundError: a model spec that resolves to nothing.
        glam.policy.CheckpointError: a saved policy with a missing, truncated or malformed file,
            of an unknown kind, or whose model needs its own code while `agent.trust_remote_code`
            is off.
        ValueError: `agent.dtype` other than float32 for a policy that is not a language model;
            `agent.protocol=generation` for a checkpoint that cannot write its actions (action
            heads, a symbolic or DRRN policy, a mediator, coded actions).
        glam.policy.CheckpointError: a mediator whose run's `ask` settings cannot be found, or a
            policy trained with coded actions whose run's iterations cannot be found.
        glam.llm.chat.ChatClientError: an `openai` endpoint that cannot be reached.
    """
    if cfg.kind == "random":
        return RandomAgent()
    if cfg.kind == "constant":
        return ConstantAgent(cfg.action)
    if cfg.kind == "fixed":
        return FixedAgent(cfg.probs)
    if cfg.kind == "bot":
        return BotAgent()
    if cfg.kind == "teacher":
        return _teacher_agent(cfg, greedy=greedy)
    if cfg.kind == "mediator":
        return MediatorAgent(agent_label(cfg), cfg.ask)
    generation, client = generation or GenerationConfig(), client or ClientConfig()
    if cfg.kind == "checkpoint" and cfg.protocol == "generation":
        return _checkpoint_generation_agent(cfg, generation, client)
    if cfg.kind == "checkpoint":
        return _checkpoint_agent(cfg, greedy=greedy)
    if cfg.protocol == "generation":
        return _generation_agent(cfg, generation, client)
    return _language_model_agent(cfg, greedy=greedy)


def _teacher_agent(cfg: AgentConfig, *, greedy: bool) -> Agent:
    teach = TeachConfig(teacher=cfg.teacher, model=cfg.model, temperature=cfg.temperature or 1.0)
    scorer = None
    if cfg.teacher == "llm":  # one model for every action space the suites use
        scorer = LocalScorer.load(cfg.model, device=resolve_device(cfg.device))

    def factory(minigrid_actions: tuple[int, ...]):
        return build_teacher(teach, minigrid_actions, scorer=scorer)

    return TeacherAgent(agent_label(cfg), factory, greedy=greedy)


def _policy_folder(cfg: AgentConfig) -> Path:
    """The saved policy `agent.path` names: the folder itself, or a run's or checkpoint's."""
    path = Path(cfg.path)
    if not path.exists():
        raise FileNotFoundError(f"agent.path={cfg.path!r} does not exist (checkpoint expected)")
    folder = path if _is_saved_policy(path) else policy_dir(path)
    if not _is_saved_policy(folder):
        raise FileNotFoundError(f"{folder} holds no saved policy (a save_pretrained folder)")
    return folder


def _checkpoint_agent(cfg: AgentConfig, *, greedy: bool) -> Agent:
    folder = _policy_folder(cfg)
    policy = load_policy(folder, trust_remote_code=_trust_remote_code(cfg))
    policy.to(resolve_device(cfg.device)).eval()
    ask = _run_ask_settings(folder, policy)
    if cfg.planner is not None:
        if ask is None:
            raise ValueError(
                f"agent.planner={cfg.planner}: {folder} holds no mediator (a policy trained with "
                "ask.mode other than none), there is no planner to swap"
            )
        ask = _swap_planner(ask, cfg.planner, cfg.ask)
    if isinstance(policy, WritingActorCritic):  # it writes its actions (policy.kind=generate)
        agent = _writing_checkpoint_agent(cfg, policy, greedy=greedy)
    elif isinstance(policy, LLMActorCritic):
        agent = _llm_checkpoint_agent(cfg, policy, greedy=greedy)
    else:
        agent = _baseline_checkpoint_agent(cfg, policy, greedy=greedy)
    if ask is not None:  # LLM4RL's mediator: it plays the envs its run mediated
        agent = MediatorAgent(agent.name, ask, policy=agent if ask.mode == "learned" else None)
    coded = run_coded_actions(folder, getattr(policy, "action_words", ()))
    if coded is not None:  # RL-GPT: the coded actions it was trained with join the env's
        agent = CodeactAgent(agent, *coded)
    agent.trained_nbr_obs, agent.trained_action_space = _training_env(folder, policy.training_env)
    return agent


def _checkpoint_generation_agent(
    cfg: AgentConfig, generation: GenerationConfig, client_cfg: ClientConfig
) -> GenerationAgent:
    """A trained language policy writing its actions under BALROG's protocol: its model, the
    LoRA adapter folded in, answers BALROG's dialogue in this process exactly as a zero-shot
    model does (`_generation_agent`): BALROG's agent type, reading, client settings and
    invalid-answer handling, none of the policy's own (its prompt format, stop tokens,
    normalised reading, sampling temperature). A writing policy and a scoring one whose
    language-model head scored the action strings both can; the others are refused.

    Raises:
        ValueError: a policy that cannot write its actions (`_generation_problem`).
    """
    folder = _policy_folder(cfg)
    problem = _generation_problem(folder)
    if problem is not None:
        raise ValueError(
            f"agent.protocol=generation: {folder} {problem}; evaluate it with the default "
            "agent.protocol=scoring"
        )
    policy = load_policy(folder, trust_remote_code=_trust_remote_code(cfg))
    model = policy.model
    if isinstance(model, PeftModel):  # fold the adapter in: one plain forward per token
        model = model.merge_and_unload()
    if cfg.dtype != "float32":
        model.to(DTYPES[cfg.dtype])
    name = agent_label(cfg)
    client = LocalChatClient(
        model.to(resolve_device(cfg.device)),
        policy.tokenizer,
        model_id=name,
        temperature=client_cfg.temperature,
        max_tokens=client_cfg.max_tokens,
        batch_size=cfg.batch_size,
    )
    agent = _dialogue_agent(name, client, generation)
    _, agent.trained_action_space = _training_env(folder, policy.training_env)
    return agent


def _generation_problem(folder: Path) -> str | None:
    """Why the policy saved in `folder` cannot write its actions in BALROG's dialogue, or None.

    A writing policy (`policy.kind=generate`) was trained to write them; a scoring one
    (`policy.kind=llm`, `policy.head=scoring`) was trained to raise the likelihood of the action
    strings after its prompt, the very tokens it must now write, as a BC adapter was (which
    `agent.kind=bc agent.protocol=generation` plays). The others have nothing to write with.
    """
    meta = read_policy_config(folder)
    kind = meta.get("kind", "llm")
    if kind not in ("llm", "generate"):
        return f"holds a {kind} policy, which has no language model to write its actions"
    if (meta.get("policy") or {}).get("head") == "action_heads":
        return (
            "holds a policy whose actions are the outputs of heads on the prompt's "
            "representation (policy.head=action_heads): its language-model head was never "
            "trained to name them"
        )
    words = list(meta.get("action_words") or ())
    if words == list(MEDIATOR_ACTIONS):
        return "holds LLM4RL's mediator, whose actions (ask the planner, or not) are not the env's"
    if run_coded_actions(folder, words) is not None:
        return "holds a policy trained with coded actions, which BALROG's dialogue does not offer"
    return None


def _writing_checkpoint_agent(
    cfg: AgentConfig, policy: WritingActorCritic, *, greedy: bool
) -> Agent:
    """A policy that writes its action, in the prompt format it was trained with; the
    evaluation's `agent.temperature` is its sampling temperature."""
    if cfg.dtype != "float32":
        policy.model.to(DTYPES[cfg.dtype])  # the value head stays in fp32
    if cfg.temperature is not None:
        policy.generation = replace(policy.generation, temperature=cfg.temperature)
    return WritingAgent(agent_label(cfg), policy, greedy=greedy, batch_size=cfg.batch_size)


def _llm_checkpoint_agent(cfg: AgentConfig, policy: LLMActorCritic, *, greedy: bool) -> Agent:
    if cfg.dtype != "float32":
        policy.model.to(DTYPES[cfg.dtype])  # the heads stay in fp32
    if cfg.temperature is not None:
        policy.policy_cfg.temperature = cfg.temperature
    action_heads = policy.policy_cfg.head == "action_heads"

    def score(prompts: list[str], action_words: tuple[str, ...]) -> torch.Tensor:
        if action_heads:
            # One output per action position: a renamed or translated action space keeps
            # minigrid's order, so output k still stands for the same action.
            if len(action_words) != len(policy.action_words):
                raise ValueError(
                    f"the policy has {len(policy.action_words)} action heads, the env "
                    f"{len(action_words)} actions {list(action_words)}"
                )
            return policy(prompts, None).logits
        return policy(prompts, [list(action_words)] * len(prompts)).logits

    history = _history_factory(policy.policy_cfg.prompt_format, policy.tokenizer)
    return ScoringAgent(
        agent_label(cfg), score, greedy=greedy, batch_size=cfg.batch_size, history_factory=history
    )


def _baseline_checkpoint_agent(cfg: AgentConfig, policy: torch.nn.Module, *, greedy: bool) -> Agent:
    """A policy trained from scratch: BabyAI's symbolic actor-critic on the grid, or a text
    policy scoring the action strings of GLAM's prompt (DRRN's Q values)."""
    if cfg.dtype != "float32":
        raise ValueError(
            f"agent.dtype={cfg.dtype} lowers a language model's weights; a "
            f"{type(policy).__name__} runs in float32 (set agent.dtype=float32)"
        )
    temperature = cfg.temperature or 1.0
    if getattr(policy, "observation_kind", "text") == "grid":
        return SymbolicAgent(
            agent_label(cfg),
            policy,
            greedy=greedy,
            temperature=temperature,
            batch_size=cfg.batch_size,
        )

    def score(prompts: list[str], action_words: tuple[str, ...]) -> torch.Tensor:
        return policy(prompts, [list(action_words)] * len(prompts)).logits / temperature

    return ScoringAgent(agent_label(cfg), score, greedy=greedy, batch_size=cfg.batch_size)


_PLANNER_KEYS = ("model", "backend", "base_url", "model_id", "timeout", "max_retries", "cache")
"""The `ask` keys that say which planner answers and how; `agent.planner` takes them from
`agent.ask`, the run's other `ask` settings (cost, budget, subgoal shown...) stay."""


def _swap_planner(run: AskConfig, planner: str, settings: AskConfig) -> AskConfig:
    """The run's `ask` settings with `planner` answering, configured as `settings` says."""
    return replace(run, planner=planner, **{key: getattr(settings, key) for key in _PLANNER_KEYS})


def _run_ask_settings(policy_folder: Path, policy: torch.nn.Module) -> AskConfig | None:
    """The `ask` settings of the run that trained a mediator (a policy over `MEDIATOR_ACTIONS`),
    from its config.yaml beside `policy/`; None for any other policy.

    Raises:
        CheckpointError: a mediator without its run's `ask` settings (a policy folder copied on
            its own: evaluate its checkpoint or run folder), or with unreadable ones; a run
            trained with `ask.mode` other than `none` whose policy is not a mediator.
    """
    run_config = policy_folder.parent / "config.yaml"
    section = OmegaConf.load(run_config).get("ask") if run_config.is_file() else None
    mediator = list(getattr(policy, "action_words", ())) == list(MEDIATOR_ACTIONS)
    mode = section.get("mode", "none") if section is not None else "none"
    if not mediator:
        if mode != "none":
            raise CheckpointError(
                f"{run_config} says ask.mode={mode!r}, but {policy_folder} holds no mediator "
                f"(its actions are not {list(MEDIATOR_ACTIONS)})"
            )
        return None
    if mode == "none":
        where = (
            f"{run_config} says ask.mode=none"
            if section is not None
            else (f"{policy_folder} has no config.yaml beside it")
        )
        raise CheckpointError(
            f"{policy_folder} holds a mediator (actions {list(MEDIATOR_ACTIONS)}), which plays "
            f"in envs built from its run's ask settings, but {where}: give agent.path the run "
            "or checkpoint folder it was saved in"
        )
    try:
        return AskConfig(**OmegaConf.to_container(section, resolve=True))
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{run_config}: unusable ask settings: {error}") from None


def _trust_remote_code(cfg: AgentConfig) -> bool:
    """The user's `agent.trust_remote_code` (off when the config has no such field): whether a
    model's own Python code may run. Never taken from the evaluated folder."""
    return getattr(cfg, "trust_remote_code", False) is True


TRAINING_ENV_KEYS = ("name", "nbr_obs", "action_space", "language")
"""Env settings compared between a policy's own record and its run's `config.yaml`."""


def trained_level(cfg: AgentConfig) -> str | None:
    """The level `agent.kind=checkpoint`'s policy was trained on, read from its record (its
    `glam_policy.json`, else its run's `config.yaml`) without loading it; None for other
    agents or a policy that records none.

    Raises:
        FileNotFoundError: `agent.path` holds no saved policy.
    """
    if cfg.kind != "checkpoint":
        return None
    folder = _policy_folder(cfg)
    recorded = (read_policy_config(folder).get("env") or {}).get("name")
    run_config = folder.parent / "config.yaml"
    if recorded is None and run_config.is_file():
        recorded = (OmegaConf.load(run_config).get("env") or {}).get("name")
    return recorded


def _training_env(
    policy_folder: Path, recorded: Mapping[str, Any] | None
) -> tuple[int | None, str | None]:
    """`env.nbr_obs` and `env.action_space` the policy was trained with.

    From the policy's own record (`glam_policy.json`, which travels with the weights), else from
    the run's `config.yaml` beside `policy/` in a checkpoint. When both exist and disagree, the
    policy's record is used and a warning says so; with neither, a warning names the defaults the
    evaluation falls back to.
    """
    run_config = policy_folder.parent / "config.yaml"
    from_run: dict | None = None
    if run_config.is_file():
        env = OmegaConf.load(run_config).get("env") or {}
        from_run = {key: env.get(key) for key in TRAINING_ENV_KEYS if env.get(key) is not None}
    if recorded is not None:
        own = {key: recorded.get(key) for key in TRAINING_ENV_KEYS}
        differ = {key: value for key, value in (from_run or {}).items() if own[key] != value}
        if differ:
            details = ", ".join(f"{k}={own[k]!r} (config.yaml: {v!r})" for k, v in differ.items())
            warnings.warn(
                f"{policy_folder / 'glam_policy.json'} and {run_config} disagree on the "
                f"training env: {details}; evaluating with the policy's own record",
                stacklevel=3,
            )
        return own["nbr_obs"], own["action_space"]
    if from_run is not None:
        return from_run.get("nbr_obs"), from_run.get("action_space")
    warnings.warn(
        f"{policy_folder} does not record the env it was trained on (a policy saved before "
        f"glam_policy.json held it, with no config.yaml beside it): assuming "
        f"nbr_obs={DEFAULT_NBR_OBS} and the level's default action space; set eval.nbr_obs and "
        "eval.action_space to the training run's env.nbr_obs and env.action_space",
        stacklevel=3,
    )
    return None, None


def _is_saved_policy(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file()


def _load_language_model(
    cfg: AgentConfig,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, BCPolicyInfo | None]:
    """The zero-shot model, or the BC folder's model with its adapter merged and its record."""
    info = None
    if cfg.kind == "bc":
        if not Path(cfg.path).is_dir():
            raise FileNotFoundError(f"agent.path={cfg.path!r} is not a folder (BC policy expected)")
        info = read_bc_policy_info(cfg.path)
        model, tokenizer = load_bc_policy(
            cfg.path, dtype=cfg.dtype, merge=True, trust_remote_code=_trust_remote_code(cfg)
        )
    else:
        model, tokenizer = load_model(
            cfg.model, dtype=cfg.dtype, trust_remote_code=_trust_remote_code(cfg)
        )
    return model.to(resolve_device(cfg.device)).eval(), tokenizer, info


def _language_model_agent(cfg: AgentConfig, *, greedy: bool) -> Agent:
    model, tokenizer, info = _load_language_model(cfg)
    # A BC policy scores the way it was cloned: the same prompt format and normalisation.
    prompt_format = info.prompt_format if info else cfg.prompt_format
    normalization = info.normalization if info else cfg.normalization
    temperature = cfg.temperature or 1.0

    def score(prompts: list[str], action_words: tuple[str, ...]) -> torch.Tensor:
        candidates = [list(action_words)] * len(prompts)
        scored = score_candidates(model, tokenizer, prompts, candidates, normalization)
        return scored.scores / temperature

    history = _history_factory(prompt_format, tokenizer)
    agent = ScoringAgent(
        agent_label(cfg), score, greedy=greedy, batch_size=cfg.batch_size, history_factory=history
    )
    if info is not None:
        agent.trained_nbr_obs, agent.trained_action_space = info.nbr_obs, info.action_space
    return agent


def _generation_agent(
    cfg: AgentConfig, generation: GenerationConfig, client_cfg: ClientConfig
) -> GenerationAgent:
    """A model writing its actions in BALROG's dialogue, in this process or behind a server."""
    client: ChatClient
    if client_cfg.backend == "openai":
        client = OpenAIChatClient(client_cfg)
        name = f"zero_shot-generation:{client.model_id}"
    else:
        model, tokenizer, info = _load_language_model(cfg)
        name = agent_label(cfg)
        client = LocalChatClient(
            model,
            tokenizer,
            model_id=Path(cfg.path or cfg.model).name or cfg.model,
            temperature=client_cfg.temperature,
            max_tokens=client_cfg.max_tokens,
            batch_size=cfg.batch_size,
        )
    agent = _dialogue_agent(name, client, generation)
    if client_cfg.backend == "local" and info is not None:
        agent.trained_action_space = info.action_space
    return agent


def _dialogue_agent(name: str, client: ChatClient, generation: GenerationConfig) -> GenerationAgent:
    """`client` writing the actions in BALROG's dialogue, as `eval.generation` sets it."""
    return GenerationAgent(
        name,
        client,
        agent_type=generation.agent_type,
        max_history=generation.max_history,
        max_cot_history=generation.max_cot_history,
        feedback_on_invalid_action=generation.feedback_on_invalid_action,
    )


def _history_factory(
    prompt_format: str, tokenizer: PreTrainedTokenizerBase
) -> Callable[[int], History]:
    """GLAM's history, rendered as plain text or inside the model's chat template."""
    return lambda nbr_obs: FormattedHistory(nbr_obs, prompt_format, tokenizer)
