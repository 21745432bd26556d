"""The feature probe (glam/eval/feature_probe.py, scripts/probe_features.py): last-token states,
the logistic regression, the split by episode, the target features, and the script's failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers_tiny import (
    one_torch_thread,  # noqa: F401  (autouse fixture: one torch thread)
    tiny_causal_lm,
)

import babyai_text
from babyai_text.describe import describe_env
from glam.baselines.loading import load_policy
from glam.bc.bot import collect_bot_demos
from glam.bc.config import DemosConfig
from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig
from glam.demos import write_demos
from glam.eval.feature_probe import (
    HeadFit,
    ProbeInputError,
    TargetFeatures,
    check_layers,
    explained_variance,
    fit_linear_probe,
    fit_ridge,
    fit_value_head,
    last_token_states,
    majority_accuracy,
    probe_states,
    probe_task,
    r_squared,
    read_played_episodes,
    read_states,
    replay_returns,
    split_episodes,
    states_from_records,
    table_accuracy,
    table_value,
    target_features,
)
from glam.models.loading import load_model
from glam.policy.llm_policy import LLMActorCritic
from glam.runs.folder import policy_dir

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "Goal of the agent: go to the red ball\nObservation 0: You see a wall 2 steps forward,\n"
    "Action 0:",
    "Goal of the agent: open the grey door\nAction 0:",
    "You see a red ball 1 step left,",
    "Goal of the agent: pick up the blue key, then go to the green box\nObservation 0: You see "
    "a closed yellow door 3 steps left and 2 steps forward, You see a wall 1 step right,\n"
    "Action 0:",
    "turn left",
]


# --------------------------------------------------------------------------------------------
# Last-token states
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])  # rotary and absolute positions
def test_last_token_states_equal_each_prompt_forwarded_alone(arch: str, dtype: torch.dtype) -> None:
    model, tokenizer = tiny_causal_lm(arch, num_layers=3)
    model = model.to(dtype)
    batched = last_token_states(model, tokenizer, PROMPTS, [0, 2, 3], batch_size=3)
    # In float64 a padded batch gives the lone forward's numbers to 1e-5; in float32 its matrix
    # products round differently, by about 1e-7 of the state's scale (this tiny model's states
    # reach 100), so the tolerance there is 1e-5 of the largest entry.
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            alone = model(input_ids=ids, output_hidden_states=True).hidden_states
        for layer in (0, 2, 3):
            expected = alone[layer][0, -1].float()
            scale = 1.0 if dtype == torch.float64 else max(1.0, expected.abs().max().item())
            torch.testing.assert_close(batched[layer][i], expected, atol=1e-5 * scale, rtol=0)
    # The prompts differ in length: the batches really were padded.
    lengths = {len(tokenizer(p)["input_ids"]) for p in PROMPTS}
    assert len(lengths) == len(PROMPTS)


def test_layers_out_of_range_are_refused() -> None:
    assert check_layers([30, 26, 26], 30) == [26, 30]
    with pytest.raises(ProbeInputError, match="numbered 0 .* to 30"):
        check_layers([26, 31], 30)
    with pytest.raises(ProbeInputError, match="--layers -1"):
        check_layers([-1], 30)


# --------------------------------------------------------------------------------------------
# Logistic regression, majority, split by episode
# --------------------------------------------------------------------------------------------


def test_logistic_regression_separates_a_linearly_separable_problem() -> None:
    generator = torch.Generator().manual_seed(0)
    centres = torch.tensor([[4.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 4.0]])
    labels = torch.randint(0, 3, (300,), generator=generator)
    # Offsets and scales that standardisation has to undo; noise well inside the margins.
    features = centres[labels] + 0.3 * torch.randn(300, 3, generator=generator)
    features = features * torch.tensor([1.0, 100.0, 0.01]) + torch.tensor([5.0, -200.0, 3.0])
    train, test = slice(0, 200), slice(200, None)
    probe = fit_linear_probe(features[train], labels[train], 3, l2=1e-4)
    assert probe.accuracy(features[test], labels[test]) == 1.0
    assert probe.accuracy(features[train], labels[train]) == 1.0


def test_logistic_regression_on_noise_scores_the_majority_rate() -> None:
    generator = torch.Generator().manual_seed(1)
    states = 1200
    labels = torch.multinomial(torch.tensor([0.6, 0.25, 0.15]), states, True, generator=generator)
    noise = torch.randn(states, 20, generator=generator)
    episodes = torch.arange(states) // 10  # 120 episodes of 10 states
    train_ids, test_ids = split_episodes(episodes.tolist(), 0.25, seed=0)
    result = probe_task(noise, labels, episodes, train_ids, test_ids, 3, seed=1)
    test = torch.isin(episodes, torch.tensor(test_ids))
    train = ~test
    majority = majority_accuracy(labels[train], labels[test])
    assert 0.5 < majority < 0.7  # the commonest class, not an artefact of the draw
    assert result["accuracy"] == pytest.approx(majority, abs=0.04)


def test_majority_accuracy_uses_the_training_split_majority() -> None:
    train = torch.tensor([2, 2, 1, 0, 2])
    test = torch.tensor([1, 1, 2, 0])
    assert majority_accuracy(train, test) == 0.25


def test_the_table_rule_takes_each_keys_commonest_label_by_hand() -> None:
    keys = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [3.0, 1.0]])
    labels = torch.tensor([2, 2, 0, 1, 0, 1])  # key (1,2): 2; key (0,0): a tie, the lowest, 0
    test_keys = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 1.0], [9.0, 9.0]])
    # (9, 9) was never seen: the commonest label overall (0, 1 and 2 tie at 2: the lowest, 0)
    assert table_accuracy(keys, labels, test_keys, torch.tensor([2, 0, 1, 0])) == 1.0
    assert table_accuracy(keys, labels, test_keys, torch.tensor([0, 1, 1, 2])) == 0.25


def test_split_is_by_episode_seeded_and_disjoint() -> None:
    episodes = [e for e in range(40) for _ in range(e % 5 + 1)]  # episodes of 1 to 5 states
    kept, held = split_episodes(episodes, 0.25, seed=3)
    assert not set(kept) & set(held)
    assert set(kept) | set(held) == set(range(40))
    assert len(held) == 10
    assert (kept, held) == split_episodes(episodes, 0.25, seed=3)
    assert held != split_episodes(episodes, 0.25, seed=4)[1]
    assert split_episodes([7, 7, 9], 0.9, seed=0) in (([7], [9]), ([9], [7]))  # one each side
    with pytest.raises(ProbeInputError, match="at least two"):
        split_episodes([5, 5, 5], 0.25, seed=0)


# --------------------------------------------------------------------------------------------
# Target features and the replay of episodes
# --------------------------------------------------------------------------------------------


def test_target_features_of_a_hand_placed_gotoredball_agent() -> None:
    env = babyai_text.make("BabyAI-GoToRedBall-v0", action_space="nav")
    env.reset(seed=0)
    base = env.unwrapped
    assert [tuple(obj.cur_pos) for obj in base.instrs.desc.obj_set] == [(2, 2)]
    # At (3, 4) facing north (up, -y): the ball at (2, 2) is 1 column left and 2 rows ahead.
    assert base.grid.get(3, 4) is None
    base.agent_pos, base.agent_dir = np.array([3, 4]), 3
    target = target_features(env)
    assert target == TargetFeatures(right=-1, forward=2, visible=True)
    assert target.direction == "left"
    assert "You see a red ball 1 step left and 2 steps forward" in describe_env(env)
    # Facing south from there, the ball is behind the agent, out of its view.
    base.agent_dir = 1
    target = target_features(env)
    assert target == TargetFeatures(right=1, forward=-2, visible=False)
    assert target.direction == "not visible"
    assert not any("red ball" in sentence for sentence in describe_env(env))
    # At (2, 4) facing north: straight ahead (a green key between does not hide it).
    base.agent_pos, base.agent_dir = np.array([2, 4]), 3
    assert target_features(env) == TargetFeatures(right=0, forward=2, visible=True)
    assert target_features(env).direction == "forward"


def test_missions_without_one_target_are_refused() -> None:
    env = babyai_text.make("BabyAI-PutNextLocal-v0", action_space="default")
    env.reset(seed=0)
    with pytest.raises(ProbeInputError, match="does not name one target object"):
        target_features(env)


def _where(target: TargetFeatures) -> str:
    """BabyAI-Text's words for a cell `right` and `forward` of the agent."""

    def steps(n: int, direction: str) -> str:
        return f"{n} step{'' if n == 1 else 's'} {direction}"

    parts = []
    if target.right:
        parts.append(steps(abs(target.right), "right" if target.right > 0 else "left"))
    if target.forward or not target.right:
        parts.append(steps(target.forward, "forward"))
    return " and ".join(parts)


def _config(episodes: int = 4) -> DemosConfig:
    return DemosConfig(
        level="BabyAI-GoToRedBall-v0",
        episodes=episodes,
        seed=5,
        nbr_obs=1,
        action_space="nav",
        output_dir="unused",
    )


def _collect(config: DemosConfig):
    records, _ = collect_bot_demos(config)
    return states_from_records(records, config.level, config.action_space)


def test_replayed_targets_are_where_each_prompt_says() -> None:
    states = _collect(_config())
    assert len(states) > 8 and len(set(states.episodes)) == 4
    assert set(states.actions) <= set(states.action_words)
    for prompt, target in zip(states.prompts, states.targets, strict=True):
        said = f"You see a red ball {_where(target)},"
        assert (said in prompt) == target.visible, (prompt, target)
    directions = {target.direction for target in states.targets}
    assert "forward" in directions and len(directions) >= 2


def test_a_demonstrations_folder_replays_to_the_same_targets(tmp_path: Path) -> None:
    config = _config(3)
    records, _ = collect_bot_demos(config)
    write_demos(records, tmp_path / "demos", metadata={"language": None})
    states = read_states(tmp_path / "demos")
    assert states.targets == _collect(config).targets
    assert states.level == "BabyAI-GoToRedBall-v0"
    # Another seed replays another episode: refused, not silently mislabelled.
    moved = [{**vars(record), "seed": record.seed + 100} for record in records]
    write_demos(moved, tmp_path / "moved")
    with pytest.raises(ProbeInputError, match="does not reproduce its prompt"):
        read_states(tmp_path / "moved")


def test_probe_states_counts_a_split_by_episode() -> None:
    states = _collect(_config(8))
    hidden = {1: torch.randn(len(states), 4, generator=torch.Generator().manual_seed(0))}
    report = probe_states(states, hidden, held_out=0.25, seed=0, l2=1.0)
    assert report["train"]["episodes"] + report["test"]["episodes"] == 8
    assert report["train"]["states"] + report["test"]["states"] == len(states)
    action = report["tasks"]["action"]
    assert sum(action["test_counts"].values()) == report["test"]["states"]
    assert set(action["probes"]) == {"hand_made", "layer_1"}
    direction = report["tasks"]["direction"]["probes"]["hand_made"]
    assert direction["l2"] == 1.0 and 0.0 <= direction["accuracy"] <= 1.0


def test_returns_are_each_episodes_discounted_reward_by_hand() -> None:
    config = _config(3)
    records, _ = collect_bot_demos(config)
    gamma = 0.9
    returns = replay_returns(records, config.level, config.action_space, gamma=gamma)
    for episode in sorted({record.episode for record in records}):
        rows = sorted(
            (i for i, record in enumerate(records) if record.episode == episode),
            key=lambda i: records[i].step,
        )
        env = babyai_text.make(config.level, action_space=config.action_space)
        env.reset(seed=records[rows[0]].seed)
        for i in rows:
            _, reward, *_ = env.step(records[i].action_index)
        # The bot succeeds: one reward, 1 - 0.9 * steps / max_steps, at its last step.
        assert reward == pytest.approx(1 - 0.9 * len(rows) / env.unwrapped.max_steps)
        for step, i in enumerate(rows):
            assert returns[i] == pytest.approx(gamma ** (len(rows) - 1 - step) * reward)
    assert _collect(config).returns == replay_returns(records, config.level, config.action_space)
    with pytest.raises(ProbeInputError, match="gamma"):
        replay_returns(records, config.level, config.action_space, gamma=1.5)


def test_ridge_regression_and_explained_variance_by_hand() -> None:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator, dtype=torch.float64)
    y = 2.0 * x[:, 0] - x[:, 2] + 0.5
    probe = fit_ridge(x, y, 1e-9)  # next to no penalty: least squares, exact on a linear target
    assert torch.allclose(probe.predict(x), y, atol=1e-6)
    assert explained_variance(probe.predict(x), y) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(y, 7.0), y) == pytest.approx(0.0)  # no bias counted
    assert r_squared(torch.full_like(y, float(y.mean())), y) == pytest.approx(0.0)
    shifted = float(y.mean()) + float(y.std(unbiased=False))  # one std off: R^2 = 1 - 1 - 1
    assert r_squared(torch.full_like(y, shifted), y) == pytest.approx(-1.0)
    # The closed form against the penalised normal equations solved by hand.
    z = (x - x.mean(0)) / x.std(0, unbiased=False)
    l2 = 0.3
    expected = torch.linalg.solve(
        z.T @ z / 200 + l2 * torch.eye(3, dtype=torch.float64), z.T @ (y - y.mean()) / 200
    )
    assert torch.allclose(fit_ridge(x, y, l2).weight, expected)
    # Each key's mean return: a perfect guess where the return is a function of the key.
    keys = torch.tensor([[0.0], [1.0], [0.0], [1.0]])
    assert (
        table_value(
            keys, torch.tensor([1.0, 3.0, 1.0, 3.0]), keys, torch.tensor([1.0, 3.0, 1.0, 3.0])
        )
        == 1.0
    )


def test_the_value_probe_reads_returns_from_features_that_hold_them() -> None:
    states = _collect(_config(8))
    returns = torch.tensor(states.returns, dtype=torch.float64)
    noise = torch.randn(len(states), 4, generator=torch.Generator().manual_seed(0))
    holding = torch.cat([noise, returns[:, None]], 1)  # one dimension is the return itself
    report = probe_states(states, {1: noise, 2: holding}, held_out=0.25, seed=0)
    value = report["value"]
    assert value["probes"]["layer_2"]["r2"] > 0.99
    assert value["probes"]["layer_1"]["r2"] < 0.5
    assert value["mean"] <= 0.0 and "validation_r2" in value["probes"]["layer_1"]
    # Returns set by the step alone: the step's control explains them, the noise does not.
    states.returns = [0.9 - 0.01 * step + 0.001 * step * step for step in states.steps]
    value = probe_states(states, {1: noise}, held_out=0.25, seed=0)["value"]
    assert value["step_r2"] > 0.999 and value["hand_made_and_step_r2"] > 0.99
    assert value["probes"]["layer_1"]["r2"] < 0.5


def _evaluation_of(records, folder: Path, nbr_obs: int = 1) -> Path:
    """An evaluation's folder (`scripts/post_training_tests.py`'s results.json and
    episodes.jsonl) whose episodes played the actions of `records`, one row per episode."""
    folder.mkdir(parents=True)
    rows = []
    for episode in sorted({record.episode for record in records}):
        steps = sorted((r for r in records if r.episode == episode), key=lambda r: r.step)
        actions = " ".join(str(r.action_index) for r in steps)
        row = {"suite": "no_change", "seed": steps[0].seed, "success": steps[0].success}
        rows.append({**row, "length": len(steps), "actions": actions})
    rows.append({**rows[0], "suite": "other_language"})  # another suite's row: not read
    (folder / "episodes.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    results = {
        "action_space": "nav",
        "nbr_obs": nbr_obs,
        "prompt_format": "glam",
        "eval": {"level": "BabyAI-GoToRedBall-v0", "distractors": None, "max_steps": None},
    }
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_played_episodes_replay_to_the_same_decisions_and_returns(tmp_path: Path) -> None:
    config = _config(3)
    records, _ = collect_bot_demos(config)
    folder = _evaluation_of(records, tmp_path / "eval")
    played = read_played_episodes(
        folder / "episodes.jsonl", config.level, action_space="nav", nbr_obs=1
    )
    # An agent that played the bot's actions visited the bot's states and got its returns.
    bot = _collect(config)
    assert played.prompts == bot.prompts and played.actions == bot.actions
    assert played.returns == bot.returns and played.targets == bot.targets
    assert played.settings["episodes_of"] == "agent"
    assert played.steps == [record.step for record in records]
    assert "the agent's" in probe_states(played, {}, held_out=0.34, seed=0)["value"]["target"]
    # A row that the replay does not end as recorded, or an invalid action, is refused.
    rows = (folder / "episodes.jsonl").read_text().splitlines()
    lying = {**json.loads(rows[0]), "success": False}
    (folder / "episodes.jsonl").write_text(json.dumps(lying) + "\n")
    with pytest.raises(ProbeInputError, match="ended after"):
        read_played_episodes(folder / "episodes.jsonl", config.level, action_space="nav", nbr_obs=1)
    invalid = {**json.loads(rows[0]), "actions": "2 - 1"}
    (folder / "episodes.jsonl").write_text(json.dumps(invalid) + "\n")
    with pytest.raises(ProbeInputError, match="invalid action"):
        read_played_episodes(folder / "episodes.jsonl", config.level, action_space="nav", nbr_obs=1)


def test_the_value_head_learns_a_linear_return_at_a_working_rate_and_not_at_a_tiny_one() -> None:
    generator = torch.Generator().manual_seed(0)
    x = 3.0 + 0.1 * torch.randn(400, 6, generator=generator)  # large and nearly constant
    returns = (x[:, 0] - 3.0).double() * 5.0
    episodes = torch.arange(400)
    train, test = list(range(300)), list(range(300, 400))
    linear = HeadFit(lr=1e-2, steps=(10, 600), hidden_sizes=(), normalize=True)
    fitted = fit_value_head(x, returns, episodes, train, test, linear)
    assert fitted["head"] == "linear, normalised, lr 0.01"
    assert fitted["600"]["r2"] > 0.95 and fitted["600"]["r2"] > fitted["10"]["r2"]
    assert fitted["600"]["explained_variance"] > 0.95
    # PPO's default head at a tiny rate stays near its start: no better than the mean.
    stuck = fit_value_head(x, returns, episodes, train, test, HeadFit(lr=1e-6, steps=(20,)))
    assert stuck["20"]["explained_variance"] < 0.1
    again = fit_value_head(x, returns, episodes, train, test, linear)
    assert again == fitted  # seeded


# --------------------------------------------------------------------------------------------
# The script
# --------------------------------------------------------------------------------------------


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "probe_features.py"), "--no-progress", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


TINY = ["--model", "tiny-random-llama", "--threads", "1"]


@pytest.mark.slow
def test_script_writes_its_table_and_json_and_replaces_only_its_own(tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = [*TINY, "--level", "BabyAI-GoToRedBall-v0", "--episodes", "8", "--out", str(out)]
    done = _script(*args)
    assert done.returncode == 0, done.stderr
    assert "| direction | 4 |" in done.stdout
    result = json.loads(out.read_text())
    assert result["layers"] == [0, 2]  # the defaults on a 2-layer model: L - 4 clipped, and L
    assert result["episodes"] == 8 and result["weights"] == "pretrained"
    assert result["command"].endswith(f"--out {out}")
    assert set(result["tasks"]["action"]["probes"]) == {"hand_made", "layer_0", "layer_2"}
    assert "| value (ridge) |" in done.stdout
    assert set(result["value"]["probes"]) == {"hand_made", "layer_0", "layer_2"}

    assert result["written_by"] == "scripts/probe_features.py"  # its own: a new probe replaces it
    # Another script's file only with --overwrite (tests/test_output_files.py: the rule).
    out.write_text('{"mine": 1}\n')
    again = _script(*args)
    assert again.returncode == 2 and out.read_text() == '{"mine": 1}\n'
    assert again.stderr.startswith("error: --out=") and "--overwrite" in again.stderr
    assert _script(*args, "--overwrite", "--random-init").returncode == 0
    assert json.loads(out.read_text())["weights"] == "random"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--level", "BabyAI-GoToRedBal-v0"], "unknown BabyAI level 'BabyAI-GoToRedBal-v0' (did"),
        (["--level", "BabyAI-GoToRedBall-v0", "--layers", "3"], "--layers 3: the model has 2"),
        (["--level", "BabyAI-PutNextLocal-v0"], "does not name one target object"),
        (["--level", "BabyAI-KeyInBox-v0"], "BabyAI-KeyInBox-v0: BabyAI's bot cannot solve it"),
        (["--level", "BabyAI-GoToRedBall-v0", "--model", "no-such-model"], "no-such-model"),
    ],
    ids=["unknown_level", "layer_out_of_range", "no_target", "bot_cannot_play", "unknown_model"],
)
def test_script_bad_input_exits_2_with_a_message(args: list[str], message: str) -> None:
    model = [] if "--model" in args else TINY
    done = _script(*model, *args)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_script_refuses_a_run_folder_without_a_policy(tmp_path: Path) -> None:
    done = _script("--run", str(tmp_path), "--level", "BabyAI-GoToRedBall-v0")
    assert done.returncode == 2
    assert "neither a checkpoint nor a run with checkpoints" in done.stderr
    (tmp_path / "policy").mkdir()
    done = _script("--run", str(tmp_path), "--level", "BabyAI-GoToRedBall-v0")
    assert done.returncode == 2
    assert "glam_policy.json: file is missing" in done.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder whose policy is a LoRA adapter (moved off its zero start) on the tiny
    model, trained on GoToRedBall with two observations and the navigation actions."""
    run = tmp_path_factory.mktemp("run")
    model_cfg = ModelConfig(name_or_path="tiny-random-llama", lora=AdapterConfig(r=4, alpha=8))
    env = EnvConfig(name="BabyAI-GoToRedBall-v0", nbr_obs=2, action_space="nav")
    words = list(babyai_text.get_action_space("nav").words)
    policy_cfg = PolicyConfig(value_hidden_sizes=[8])
    policy = LLMActorCritic.from_config(model_cfg, policy_cfg, words, training_env=env)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    policy.save_pretrained(run / "policy")
    return run


def test_a_runs_states_are_its_adapted_models(tiny_run: Path) -> None:
    policy = load_policy(policy_dir(tiny_run), trust_remote_code=False)
    adapted = last_token_states(policy.model, policy.tokenizer, PROMPTS, [2])[2]
    with policy.model.disable_adapter():
        base = last_token_states(policy.model, policy.tokenizer, PROMPTS, [2])[2]
    model, tokenizer = load_model("tiny-random-llama")
    torch.testing.assert_close(base, last_token_states(model, tokenizer, PROMPTS, [2])[2])
    assert (adapted - base).abs().max() > 1e-2  # the adapter is on


@pytest.mark.slow
def test_script_probes_a_run_with_its_own_prompt_settings(tiny_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "probe.json"
    args = ["--run", str(tiny_run), "--level", "BabyAI-GoToRedBall-v0", "--episodes", "6"]
    done = _script(*args, "--threads", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["weights"] == "run" and result["layers"] == [0, 2]
    assert result["states_from"]["nbr_obs"] == 2  # the run's, not the default 1
    assert result["tasks"]["action"]["classes"] == ["turn left", "turn right", "go forward"]
    done = _script(*args, "--action-space", "default")
    assert done.returncode == 2
    assert "the run's actions" in done.stderr


@pytest.mark.slow
def test_script_probes_a_runs_own_played_states(tiny_run: Path, tmp_path: Path) -> None:
    records, _ = collect_bot_demos(_config(4))
    folder = _evaluation_of(records, tmp_path / "eval", nbr_obs=2)
    out = tmp_path / "probe.json"
    args = ["--run", str(tiny_run), "--played", str(folder), "--threads", "1"]
    heads = ["--value-heads", "--head-lrs", "1e-3", "--head-steps", "3", "6"]
    done = _script(*args, *heads, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "| held-out R^2 of the agent's discounted return |" in done.stdout
    assert "| 1024x1024 sigmoid, lr 0.001, 6 steps |" in done.stdout
    result = json.loads(out.read_text())
    assert result["states_from"]["episodes_of"] == "agent"
    assert result["states"] == len(records)
    fits = result["value"]["heads"]["layer_2"]
    assert [fit["head"] for fit in fits] == [
        "1024x1024 sigmoid, lr 0.001",
        "linear, normalised, lr 0.001",
    ]
    assert set(fits[0]) == {"head", "fit", "3", "6"}
    # The evaluation played with one observation, the run was trained with two: refused.
    _evaluation_of(records, tmp_path / "one", nbr_obs=1)
    done = _script("--run", str(tiny_run), "--played", str(tmp_path / "one"))
    assert done.returncode == 2 and "nbr_obs=1" in done.stderr


def test_feature_statistics_by_hand() -> None:
    from glam.eval.feature_probe import feature_statistics

    # Two states: dimension 0 constant at 3, dimension 1 at +1 and -1.
    stats = feature_statistics(torch.tensor([[3.0, 1.0], [3.0, -1.0]]), top=1)
    assert stats["mean_norm"] == pytest.approx(10**0.5)
    assert stats["top1_share"] == pytest.approx(9 / 10)  # |mean| 3 against 0
    assert stats["varying_share"] == pytest.approx(1 / 10)  # var (0 + 1) over E[x^2] (9 + 1)
