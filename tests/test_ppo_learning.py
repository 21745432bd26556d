"""Evidence that the PPO loop learns: a seeded run that measurably raises success.

`tiny-random-llama` (random init, 94k parameters, word-level tokenizer), fully fine-tuned on
BabyAI-GoToRedBallNoDists-v0 with the three navigation actions: 8 envs x 64 steps per update,
4 epochs, lr 1e-3. The same 48 evaluation episodes (fixed seeds, fixed sampling seed) are played
by the initial and the trained policy; sampling (not argmax) makes the comparison fair to the
untrained policy, whose argmax may be a degenerate constant action.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glam.config import EnvConfig, PolicyConfig
from glam.envs import EnvRunner
from glam.ppo.rollout import play_episodes
from glam.runs.folder import policy_dir

ROOT = Path(__file__).resolve().parents[1]
UPDATES = 6
FRAMES_PER_UPDATE = 8 * 64
EVAL_EPISODES = 48
EVAL_SEED = 10**9  # far from the training seeds (run seed 1: 10**8 and up)


def evaluate(policy: torch.nn.Module, env_cfg: EnvConfig) -> tuple[float, float]:
    """Success rate and mean return over the fixed evaluation episodes."""
    runner = EnvRunner(env_cfg, PolicyConfig(), num_envs=EVAL_EPISODES, seed=EVAL_SEED)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        episodes = play_episodes(policy.eval(), runner)
    runner.close()
    successes = sum(bool(episode["success"]) for episode in episodes)
    returns = sum(float(episode["return"]) for episode in episodes)
    return successes / len(episodes), returns / len(episodes)


@pytest.mark.slow
def test_ppo_raises_success_on_go_to_red_ball(tmp_path: Path) -> None:
    from glam.policy.llm_policy import LLMActorCritic

    run_dir = tmp_path / "learn"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "train_language_agent.py"),
            "--config-name",
            "tiny",
            f"train.output_dir={run_dir}",
            "model.lora.enabled=false",
            "env.num_envs=8",
            "ppo.frames_per_env=64",
            "ppo.minibatch_size=128",
            "ppo.epochs=4",
            "ppo.lr=1e-3",
            f"train.total_frames={UPDATES * FRAMES_PER_UPDATE}",
            f"train.save_every={UPDATES}",
            "train.seed=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    trained = LLMActorCritic.from_pretrained(policy_dir(run_dir))
    initial = LLMActorCritic.from_config(
        trained.model_cfg, trained.policy_cfg, trained.action_words
    )
    env_cfg = EnvConfig(
        name="BabyAI-GoToRedBallNoDists-v0", num_envs=EVAL_EPISODES, nbr_obs=1, action_space="nav"
    )
    before_success, before_return = evaluate(initial, env_cfg)
    after_success, after_return = evaluate(trained, env_cfg)
    print(
        f"success {before_success:.2f} -> {after_success:.2f}, "
        f"return {before_return:.2f} -> {after_return:.2f}"
    )
    assert after_success >= before_success + 0.15
    assert after_success >= 0.85
    assert after_return >= before_return + 0.15
