"""LLM4RL's mediator in the evaluation harness: a learned mediator's checkpoint plays the envs its
run mediated, the rule-based baselines play without one, the queries per episode are reported
beside success and agree with the episodes file, other agents' results keep their shape, and
what a mediator cannot play is refused clearly."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate import Accelerator
from helpers_couplings import SMALL_SYMBOLIC
from helpers_tiny import save_tiny_model
from omegaconf import OmegaConf

import babyai_text
from glam.ask.config import AskConfig
from glam.baselines.symbolic import build_symbolic_policy
from glam.couplings import coupling_hooks, coupling_policy_factory
from glam.eval.config import AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate
from glam.eval.mediator_agent import MediatorAgent
from glam.policy.files import CheckpointError
from glam.ppo.trainer import train
from glam.run_config import compose_run
from glam.runs.folder import policy_dir

ROOT = Path(__file__).resolve().parents[1]
LEVEL = "BabyAI-UnlockPickup-v0"
SMALL = [*SMALL_SYMBOLIC, "train.torch_threads=1"]
"""A mediator of 8 channels trained for 3 updates (4 envs x 16 frames): a few seconds."""
ASK_FIGURES = (
    "ask/queries_per_episode",
    "ask/chosen_per_episode",
    "ask/forced_per_episode",
    "ask/cost",
    "ask/latency_s",
    "ask/ask_fraction",
    "ask/llm_calls",
    "ask/cache_hits",
)


@pytest.fixture(scope="module")
def mediator_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the ask_symbolic preset with the bot planner, `ask.mode=learned`, cost 0.02."""
    run = tmp_path_factory.mktemp("ask") / "run"
    overrides = [*SMALL, "ask.planner=bot", "ask.cost=0.02", f"train.output_dir={run}"]
    cfg = compose_run("ask_symbolic", overrides)
    policy = coupling_policy_factory(cfg, build_symbolic_policy)
    train(cfg, Accelerator(cpu=True), run, make_policy=policy, hooks=coupling_hooks(cfg))
    return run


def _evaluate(agent: AgentConfig, output: Path, **settings) -> tuple[dict, list[dict]]:
    """Results and episodes.jsonl rows of `agent` on 8 UnlockPickup episodes."""
    eval_cfg = EvalConfig(
        **{
            "level": LEVEL,
            "suites": ["no_change"],
            "episodes": 8,
            "num_envs": 4,
            "progress_bar": False,
            "output_dir": str(output),
            **settings,
        }
    )
    results, paths = evaluate(PostTrainingTestsConfig(agent=agent, eval=eval_cfg))
    episodes = [json.loads(line) for line in paths["episodes"].read_text().splitlines()]
    return results, episodes


def _mean(episodes: list[dict], key: str) -> float:
    return statistics.mean(float(episode[key]) for episode in episodes)


def test_a_learned_mediator_plays_its_run_s_mediated_envs(
    mediator_run: Path, tmp_path: Path
) -> None:
    agent = AgentConfig(kind="checkpoint", path=str(mediator_run))
    results, episodes = _evaluate(agent, tmp_path)
    # The run's ask settings, its planner included, not the defaults (llm, 0.01).
    assert (results["ask"]["mode"], results["ask"]["planner"]) == ("learned", "bot")
    assert results["ask"]["cost"] == 0.02
    record = results["suites"]["no_change"]
    figures = record["agent_figures"]
    assert set(figures) == set(ASK_FIGURES)
    assert len(episodes) == record["episodes"] == 8
    assert record["success_rate"] == _mean(episodes, "success")
    # The figures are the episodes' counts, summed and divided as training's ask/* metrics.
    assert figures["ask/queries_per_episode"] == pytest.approx(_mean(episodes, "ask/queries"))
    assert figures["ask/chosen_per_episode"] == pytest.approx(_mean(episodes, "ask/chosen"))
    assert figures["ask/forced_per_episode"] == pytest.approx(_mean(episodes, "ask/forced"))
    assert figures["ask/cost"] == pytest.approx(_mean(episodes, "ask/cost"))
    for episode in episodes:
        assert episode["ask/queries"] == episode["ask/chosen"] + episode["ask/forced"]
        assert episode["ask/forced"] >= 1  # the episode's first subgoal
        assert episode["ask/decisions"] == episode["length"]
        assert episode["ask/cost"] >= 0.01 * episode["ask/queries"]  # 0.02 - 0.1 * 0.1 at least
        # The return is net of the queries' costs: adding them back gives BabyAI's reward.
        babyai = episode["episode_return"] + episode["ask/cost"]
        assert (babyai > 0) == episode["success"] and babyai <= 1 + 1e-9
    assert 0 < figures["ask/ask_fraction"] < 1  # an untrained mediator asks at some steps
    assert figures["ask/latency_s"] > 0 and figures["ask/llm_calls"] == 0  # no language model
    assert record["per_task_type"]["pickup"]["agent_figures"] == pytest.approx(figures)
    with (tmp_path / "results.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert float(rows[0]["ask/queries_per_episode"]) == figures["ask/queries_per_episode"]
    markdown = (tmp_path / "results.md").read_text()
    assert "## The agent's own figures" in markdown and "ask.mode=learned" in markdown


def test_the_rule_baselines_ask_always_or_only_when_forced(tmp_path: Path) -> None:
    always = AgentConfig(kind="mediator", ask=AskConfig(mode="always", planner="bot"))
    results, episodes = _evaluate(always, tmp_path / "always")
    record = results["suites"]["no_change"]
    figures = record["agent_figures"]
    assert results["label"] == "mediator:always:bot"
    assert figures["ask/chosen_per_episode"] == record["mean_length"]  # a query at every step
    assert figures["ask/ask_fraction"] == 1.0
    assert figures["ask/queries_per_episode"] == pytest.approx(
        record["mean_length"] + figures["ask/forced_per_episode"]
    )
    assert all(episode["ask/chosen"] == episode["length"] for episode in episodes)
    assert record["success_rate"] == 1.0  # the oracle asked at every step: 8 of 8

    skill_end = AgentConfig(kind="mediator", ask=AskConfig(mode="skill_end", planner="bot"))
    results, episodes = _evaluate(skill_end, tmp_path / "skill_end")
    figures = results["suites"]["no_change"]["agent_figures"]
    assert figures["ask/chosen_per_episode"] == 0.0 and figures["ask/ask_fraction"] == 0.0
    assert figures["ask/queries_per_episode"] == figures["ask/forced_per_episode"] >= 1.0
    assert all(episode["ask/chosen"] == 0 for episode in episodes)


def test_other_agents_results_keep_their_shape(tmp_path: Path) -> None:
    results, episodes = _evaluate(AgentConfig(kind="random"), tmp_path, max_steps=5)
    assert "ask" not in results
    assert "agent_figures" not in results["suites"]["no_change"]
    assert set(episodes[0]) == {
        "suite",
        "seed",
        "mission",
        "task_type",
        "success",
        "episode_return",
        "length",
        "invalid_actions",
        "actions",
    }
    assert all(len(e["actions"].split()) == e["length"] for e in episodes)
    header = (tmp_path / "results.csv").read_text().splitlines()[0]
    assert "ask/" not in header and header.endswith("invalid_action_rate,status,reason")
    assert "own figures" not in (tmp_path / "results.md").read_text()


def test_what_a_mediator_cannot_play_is_refused(mediator_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="agent.kind=mediator with agent.ask.mode='none'"):
        AgentConfig(kind="mediator")
    with pytest.raises(ValueError, match=r"learned mediator is a checkpoint \(agent.kind="):
        AgentConfig(kind="mediator", ask=AskConfig(mode="learned"))
    with pytest.raises(ValueError, match="its run's own ask settings"):
        AgentConfig(kind="checkpoint", path="run", ask=AskConfig(mode="always"))
    # The policy folder alone has lost its run's ask settings (planner, cost...).
    alone = tmp_path / "policy"
    shutil.copytree(policy_dir(mediator_run), alone)
    with pytest.raises(CheckpointError, match="holds a mediator .* no config.yaml beside it"):
        _evaluate(AgentConfig(kind="checkpoint", path=str(alone)), tmp_path / "alone")
    # A run whose config.yaml has lost its ask section, or a mediator said to be plain RL.
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(policy_dir(mediator_run).parent, checkpoint)
    saved = OmegaConf.load(checkpoint / "config.yaml")
    saved.ask.mode = "none"
    OmegaConf.save(saved, checkpoint / "config.yaml")
    with pytest.raises(CheckpointError, match="says ask.mode=none"):
        _evaluate(AgentConfig(kind="checkpoint", path=str(checkpoint)), tmp_path / "none")
    # The skills and planners speak English (the harness's French suite is not applicable to
    # a reader of the grid: a French env reaches a mediator only from other code).
    agent = MediatorAgent("mediator", AskConfig(mode="always", planner="bot"))
    with pytest.raises(ValueError, match="speak English"):
        agent.wrap_env(babyai_text.make("BabyAI-GoToLocal-v0", language="fr"))


def test_the_script_takes_the_agent_s_ask_keys(tmp_path: Path) -> None:
    def script(*overrides: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(ROOT / "scripts" / "post_training_tests.py"), *overrides]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)

    common = [f"eval.level={LEVEL}", "eval.suites=[no_change]", "eval.progress_bar=false"]
    done = script(
        "agent.kind=mediator",
        "agent.ask.mode=random",
        "agent.ask.probability=0.5",
        "agent.ask.planner=bot",
        "eval.episodes=4",
        "eval.num_envs=4",
        f"eval.output_dir={tmp_path}",
        *common,
    )
    assert done.returncode == 0, done.stderr
    assert "ask/queries_per_episode" in done.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["label"] == "mediator:random(p=0.5):bot"
    assert 0 < results["suites"]["no_change"]["agent_figures"]["ask/ask_fraction"] < 1
    refused = script("agent.kind=mediator", f"eval.output_dir={tmp_path / 'no'}", *common)
    assert refused.returncode == 1 and "agent.ask.mode" in refused.stderr


def test_a_mediator_plays_with_another_planner_than_its_run_s(
    mediator_run: Path, tmp_path: Path
) -> None:
    tiny_folder = save_tiny_model(tmp_path / "tiny")
    # Trained with the bot as planner, played with a (tiny) language model: the run's other
    # ask settings stay, the language model is configured by agent.ask.
    agent = AgentConfig(
        kind="checkpoint",
        path=str(mediator_run),
        planner="llm",
        ask=AskConfig(model=str(tiny_folder), cache=True),
    )
    results, episodes = _evaluate(agent, tmp_path)
    ask = results["ask"]
    assert (ask["mode"], ask["planner"], ask["model"]) == ("learned", "llm", str(tiny_folder))
    assert ask["cost"] == 0.02 and ask["cache"] is True
    assert results["label"].endswith(f":planner=llm:{tiny_folder.name}")
    figures = results["suites"]["no_change"]["agent_figures"]
    queries = sum(episode["ask/queries"] for episode in episodes)
    # Every query reached the language model, or its cache: the bot planner was not consulted.
    assert figures["ask/llm_calls"] + figures["ask/cache_hits"] == queries >= len(episodes)
    assert figures["ask/llm_calls"] >= 1

    with pytest.raises(
        ValueError, match="agent.planner=llm swaps the planner .* agent.ask.planner"
    ):
        AgentConfig(kind="mediator", planner="llm", ask=AskConfig(mode="always"))
    with pytest.raises(ValueError, match="agent.planner='oracle' is not one of"):
        AgentConfig(kind="checkpoint", path="run", planner="oracle")
