"""Language-model agents of the harness on tiny random models: loading, protocols, decisions."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_tiny import one_torch_thread, save_tiny_model  # noqa: F401 (fixture)

from glam.config import EnvConfig, ModelConfig, PolicyConfig
from glam.eval.agents import ActRequest, ScoringAgent
from glam.eval.builders import agent_label, build_agent
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.episodes import run_suite
from glam.eval.generation import GenerationAgent
from glam.eval.harness import evaluate
from glam.eval.suites import SUITES
from glam.llm.config import ClientConfig
from glam.models.loading import load_model
from glam.policy.llm_policy import LLMActorCritic
from glam.scoring import score_candidates

WORDS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


def _play(agent, suite: str = "no_change", episodes: int = 2, max_steps: int = 3):
    return run_suite(
        agent,
        SUITES[suite],
        level="BabyAI-MixedTrainLocal-v0",
        episodes=episodes,
        num_envs=2,
        seed_base=10**9,
        nbr_obs=2,
        max_steps=max_steps,
    )


def _request(prompts: list[str]) -> ActRequest:
    return ActRequest(
        prompts=prompts,
        action_words=WORDS,
        envs=[None] * len(prompts),
        slots=list(range(len(prompts))),
        new_episode=[True] * len(prompts),
        rngs=[np.random.default_rng(k) for k in range(len(prompts))],
    )


def test_zero_shot_scoring_takes_the_most_likely_action(tiny_folder: Path) -> None:
    agent = build_agent(AgentConfig(kind="zero_shot", model=str(tiny_folder)), greedy=True)
    assert isinstance(agent, ScoringAgent)
    model, tokenizer = load_model(str(tiny_folder))
    run = _play(agent)
    prompts = [run.example_prompt, run.example_prompt.replace("Action 0:", "Action 0: drop")]
    scores = score_candidates(model, tokenizer, prompts, [list(WORDS)] * 2).scores
    decisions = agent.act(_request(prompts))
    assert [d.action for d in decisions] == scores.argmax(-1).tolist()
    assert run.example_prompt.startswith("Possible action of the agent: turn left")
    # batch_size only splits the forward passes.
    agent.batch_size = 1
    assert agent.act(_request(prompts)) == decisions


def test_temperature_divides_the_scores_a_sampling_agent_uses(tiny_folder: Path) -> None:
    plain = build_agent(AgentConfig(kind="zero_shot", model=str(tiny_folder)), greedy=False)
    tempered_cfg = AgentConfig(kind="zero_shot", model=str(tiny_folder), temperature=4.0)
    tempered = build_agent(tempered_cfg, greedy=False)
    assert tempered.name == f"zero_shot-scoring:{tiny_folder.name} (T=4)"
    prompt = _play(plain, episodes=1, max_steps=1).example_prompt
    torch.testing.assert_close(tempered.score([prompt], WORDS), plain.score([prompt], WORDS) / 4.0)
    with pytest.raises(ValueError, match="agent.temperature must be > 0"):
        AgentConfig(temperature=0.0)


def test_chat_prompt_format_wraps_the_glam_prompt(tiny_folder: Path) -> None:
    cfg = AgentConfig(kind="zero_shot", model=str(tiny_folder), prompt_format="chat")
    run = _play(build_agent(cfg, greedy=True), episodes=1, max_steps=1)
    assert run.example_prompt.startswith("<s>user\n")
    assert "Goal of the agent:" in run.example_prompt
    assert run.example_prompt.endswith("<s>assistant\n")


def _save_policy(
    tiny_folder: Path, folder: Path, training_env: EnvConfig | None = None
) -> LLMActorCritic:
    model, tokenizer = load_model(str(tiny_folder))
    policy = LLMActorCritic.from_model(
        model, tokenizer, ModelConfig(name_or_path=str(tiny_folder)), PolicyConfig(), WORDS
    )
    policy.save_pretrained(folder, training_env=training_env)
    return policy


def test_checkpoint_agent_from_run_checkpoint_or_policy_folder(
    tiny_folder: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "glam_paper" / "ppo.lr-1e-05_seed-3"
    checkpoint = run_dir / "checkpoints" / "update_000002"
    policy = _save_policy(tiny_folder, checkpoint / "policy")
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / "config.yaml").write_text("env:\n  nbr_obs: 1\n  action_space: nav\n")
    (run_dir / "checkpoints" / "latest").write_text("update_000002\n")

    prompts = [_play(build_agent(AgentConfig(kind="random"), greedy=True)).example_prompt]
    with torch.no_grad():
        expected = policy(prompts, [list(WORDS)]).logits.argmax(-1).tolist()
    for path in (run_dir, checkpoint, checkpoint / "policy"):
        cfg = AgentConfig(kind="checkpoint", path=str(path))
        assert agent_label(cfg) == "checkpoint:glam_paper/ppo.lr-1e-05"
        agent = build_agent(cfg, greedy=True)
        assert [d.action for d in agent.act(_request(prompts))] == expected
    assert len(_play(agent, suite="renamed_actions").episodes) == 2

    # The run's own prompt length and action space are used unless the config says otherwise.
    assert (agent.trained_nbr_obs, agent.trained_action_space) == (1, "nav")
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="checkpoint", path=str(run_dir)),
        eval=EvalConfig(
            episodes=2, max_steps=3, output_dir=str(tmp_path / "eval"), progress_bar=False
        ),
    )
    results, _ = evaluate(cfg)
    assert (results["nbr_obs"], results["action_space"]) == (1, "nav")
    prompt = results["suites"]["no_change"]["example_prompt"]
    assert prompt.startswith("Possible action of the agent: turn left, turn right, go forward\n")


TRAINED_ENV = EnvConfig(
    name="BabyAI-GoToRedBallNoDists-v0", nbr_obs=1, action_space="nav", reward_scale=1.0
)


def test_policy_folder_copied_alone_is_evaluated_with_its_training_env(
    tiny_folder: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "run" / "checkpoints" / "update_000001"
    _save_policy(tiny_folder, checkpoint / "policy", training_env=TRAINED_ENV)
    meta = json.loads((checkpoint / "policy" / "glam_policy.json").read_text())
    assert meta["env"] == asdict(TRAINED_ENV)  # level, language, reward scale: for the record
    alone = shutil.copytree(checkpoint / "policy", tmp_path / "copied" / "policy")
    assert not (alone.parent / "config.yaml").exists()

    agent = build_agent(AgentConfig(kind="checkpoint", path=str(alone)), greedy=True)
    assert (agent.trained_nbr_obs, agent.trained_action_space) == (1, "nav")
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="checkpoint", path=str(alone)),
        eval=EvalConfig(
            episodes=2, max_steps=3, output_dir=str(tmp_path / "eval"), progress_bar=False
        ),
    )
    results, _ = evaluate(cfg)
    assert (results["nbr_obs"], results["action_space"]) == (1, "nav")
    prompt = results["suites"]["no_change"]["example_prompt"]
    assert prompt.startswith("Possible action of the agent: turn left, turn right, go forward\n")


def test_policy_record_and_run_config_that_disagree_are_reported(
    tiny_folder: Path, tmp_path: Path
) -> None:
    checkpoint = tmp_path / "checkpoints" / "update_000001"
    _save_policy(tiny_folder, checkpoint / "policy", training_env=TRAINED_ENV)
    (checkpoint / "config.yaml").write_text(
        "env:\n  name: BabyAI-GoToRedBallNoDists-v0\n  nbr_obs: 2\n  action_space: default\n"
    )
    cfg = AgentConfig(kind="checkpoint", path=str(checkpoint))
    with pytest.warns(UserWarning, match=r"disagree .*nbr_obs=1 \(config.yaml: 2\)"):
        agent = build_agent(cfg, greedy=True)
    assert (agent.trained_nbr_obs, agent.trained_action_space) == (1, "nav")


def test_old_policy_folder_with_no_record_warns_what_it_assumes(
    tiny_folder: Path, tmp_path: Path
) -> None:
    _save_policy(tiny_folder, tmp_path / "policy")  # no training env, no config.yaml beside it
    cfg = AgentConfig(kind="checkpoint", path=str(tmp_path / "policy"))
    with pytest.warns(UserWarning, match="does not record the env .*assuming nbr_obs=3"):
        agent = build_agent(cfg, greedy=True)
    assert (agent.trained_nbr_obs, agent.trained_action_space) == (None, None)


def test_missing_or_empty_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_agent(AgentConfig(kind="checkpoint", path=str(tmp_path / "nope")), greedy=True)
    with pytest.raises(FileNotFoundError, match="neither a checkpoint nor a run"):
        build_agent(AgentConfig(kind="checkpoint", path=str(tmp_path)), greedy=True)


def test_generation_protocol_replaces_invalid_answers(tiny_folder: Path) -> None:
    cfg = AgentConfig(kind="zero_shot", model=str(tiny_folder), protocol="generation")
    agent = build_agent(cfg, greedy=True, client=ClientConfig(temperature=0, max_tokens=8))
    assert isinstance(agent, GenerationAgent)
    run = _play(agent, max_steps=2)
    assert "Your goal is to" in run.example_prompt and run.example_prompt.endswith("Action:")
    assert len(agent.answers) == run.prompts_seen == 4
    # A random model's answers are not actions: each became "go forward" and was counted.
    invalid = sum(e.invalid_actions for e in run.episodes)
    assert invalid == sum(agent_answer.strip() not in WORDS for agent_answer in agent.answers)
    assert invalid > 0


def test_a_scoring_checkpoint_writes_with_its_language_model_head_action_heads_cannot(
    tiny_folder: Path, tmp_path: Path
) -> None:
    """agent.protocol=generation with a scoring checkpoint: its language-model head, which
    scored the action strings, writes in BALROG's dialogue as a zero-shot model does (a fresh
    adapter changes nothing: the same answers as the base model's); a policy whose actions come
    from action heads is refused before its weights are loaded."""
    _save_policy(tiny_folder, tmp_path / "scoring", training_env=TRAINED_ENV)
    client = ClientConfig(temperature=0, max_tokens=4)
    checkpoint, zero_shot = (
        build_agent(
            AgentConfig(kind=kind, path=path, model=str(tiny_folder), protocol="generation"),
            greedy=False,
            client=client,
        )
        for kind, path in [("checkpoint", str(tmp_path / "scoring")), ("zero_shot", "")]
    )
    assert isinstance(checkpoint, GenerationAgent) and checkpoint.trained_action_space == "nav"
    assert checkpoint.name == f"checkpoint-generation:{tmp_path.name}/scoring"
    run = _play(checkpoint)
    _play(zero_shot)
    assert checkpoint.answers == zero_shot.answers and len(checkpoint.answers) == run.prompts_seen

    model, tokenizer = load_model(str(tiny_folder))
    heads = PolicyConfig(head="action_heads")
    LLMActorCritic.from_model(
        model, tokenizer, ModelConfig(name_or_path=str(tiny_folder)), heads, WORDS
    ).save_pretrained(tmp_path / "heads")
    cfg = AgentConfig(kind="checkpoint", path=str(tmp_path / "heads"), protocol="generation")
    with pytest.raises(ValueError, match=r"heads on the prompt's representation \(policy.head"):
        build_agent(cfg, greedy=False, client=client)
    with pytest.raises(ValueError, match="needs agent.kind zero_shot, bc, checkpoint, not random"):
        AgentConfig(kind="random", protocol="generation")
    with pytest.raises(ValueError, match="agent.protocol=generation plays none"):
        AgentConfig(kind="checkpoint", path="run", protocol="generation", planner="bot")


def test_bc_agent_scores_with_its_adapter(tiny_folder: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from glam.policy.bc_policy import BCPolicyInfo

    model, tokenizer = load_model(str(tiny_folder))
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    adapted = get_peft_model(model, lora).eval()
    adapted.save_pretrained(tmp_path / "bc")
    tokenizer.save_pretrained(tmp_path / "bc")
    info = BCPolicyInfo(base_model=str(tiny_folder), adapter=True, normalization="token")
    info.save(tmp_path / "bc")

    prompts = [_play(build_agent(AgentConfig(kind="random"), greedy=True)).example_prompt] * 2
    prompts[1] = prompts[1].replace("Action 0:", "Action 0: toggle")
    candidates = [list(WORDS)] * 2
    with torch.no_grad():
        tuned = score_candidates(adapted, tokenizer, prompts, candidates, "token").scores
        with adapted.disable_adapter():
            base = score_candidates(adapted, tokenizer, prompts, candidates, "token").scores
    assert not torch.allclose(tuned, base)  # the adapter matters, so the check below can fail
    agent = build_agent(AgentConfig(kind="bc", path=str(tmp_path / "bc")), greedy=True)
    assert [d.action for d in agent.act(_request(prompts))] == tuned.argmax(-1).tolist()
