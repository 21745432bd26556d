"""BabyAI's symbolic actor-critic: the model, its folder, `load_policy`, and its evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from helpers_tiny import one_torch_thread, save_tiny_model  # noqa: F401  (autouse fixture)
from omegaconf import OmegaConf

import babyai_text
from glam.baselines.config import SymbolicConfig
from glam.baselines.loading import load_policy, policy_kind
from glam.baselines.symbolic import FiLM, SymbolicActorCritic
from glam.config import EnvConfig, ModelConfig, PolicyConfig
from glam.eval.agents import ActRequest, SymbolicAgent, grid_observation
from glam.eval.builders import build_agent, trained_level
from glam.eval.config import DEFAULT_LEVEL, AgentConfig, EvalConfig, PostTrainingTestsConfig
from glam.eval.harness import evaluate, resolve_level
from glam.eval.suites import SUITES, plan_suite
from glam.models.loading import load_model
from glam.policy.llm_policy import CheckpointError, LLMActorCritic
from glam.policy.observations import GridObservations
from glam.runs.checkpoint import TrainerState, check_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
LEVEL = "BabyAI-MixedTrainLocal-v0"
SMALL = SymbolicConfig(
    image_dim=16, instr_dim=12, film_layers=2, hidden_dim=8, vocabulary_buckets=64
)
TRAINED_ENV = EnvConfig(name=LEVEL, nbr_obs=3, action_space="default")


def _policy(seed: int = 0, cfg: SymbolicConfig = SMALL) -> SymbolicActorCritic:
    torch.manual_seed(seed)
    return SymbolicActorCritic(cfg, WORDS).eval()


def _observations(seeds: list[int]) -> GridObservations:
    env = babyai_text.make(LEVEL)
    return GridObservations.from_minigrid([env.reset(seed=seed)[0] for seed in seeds])


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("symbolic") / "policy"
    _policy().save_pretrained(folder, training_env=TRAINED_ENV)
    return folder


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def test_one_logit_per_action_word_a_value_and_a_full_mask() -> None:
    output = _policy()(**_observations([1, 2, 3]).inputs())
    assert output.logits.shape == (3, len(WORDS)) and output.values.shape == (3,)
    assert output.mask.dtype == torch.bool and output.mask.shape == (3, len(WORDS))
    assert output.mask.all() and torch.isfinite(output.logits).all()
    # Three different rooms: three different distributions.
    assert torch.cdist(output.logits, output.logits).triu(1)[0, 1:].min() > 1e-4


def test_the_mission_and_the_view_both_change_the_output() -> None:
    policy = _policy()
    obs = _observations([1, 1])
    obs.missions = ["go to the red ball", "pick up the blue key"]
    by_mission = policy(**obs.inputs())
    assert (by_mission.logits[0] - by_mission.logits[1]).abs().max() > 1e-3
    assert (by_mission.values[0] - by_mission.values[1]).abs() > 1e-5
    obs = _observations([1, 2])
    obs.missions = ["go to the red ball"] * 2
    by_view = policy(**obs.inputs()).logits
    assert (by_view[0] - by_view[1]).abs().max() > 1e-3


def test_gradients_reach_every_parameter() -> None:
    policy = _policy().train()
    output = policy(**_observations([1, 2, 3, 4]).inputs())
    (output.dist.entropy().sum() + output.logits[:, 2].sum() + output.values.sum()).backward()
    silent = [
        name for name, p in policy.named_parameters() if p.grad is None or not p.grad.abs().sum()
    ]
    assert not silent, silent


def test_an_env_acts_the_same_whatever_its_batch_and_the_mode() -> None:
    """Per-example normalisation: the rollout (eval mode, all envs) and the update (train mode,
    shuffled minibatches) compute one function; BabyAI's BatchNorm would not."""
    policy = _policy()
    obs = _observations([5, 6, 7, 8])
    with torch.no_grad():
        whole = policy.eval()(**obs.inputs())
        alone = policy.train()(**obs.select([2]).inputs())
        shuffled = policy(**obs.select([3, 2, 0]).inputs())
    torch.testing.assert_close(alone.logits[0], whole.logits[2], rtol=0, atol=1e-6)
    torch.testing.assert_close(shuffled.values, whole.values[[3, 2, 0]], rtol=0, atol=1e-6)


def test_film_computes_gamma_times_x_plus_beta() -> None:
    film = FiLM(condition_dim=2, channels=2)
    with torch.no_grad():
        film.gamma.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
        film.gamma.bias.copy_(torch.tensor([0.0, 1.0]))
        film.beta.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 0.0]]))
        film.beta.bias.copy_(torch.tensor([0.5, 0.0]))
    condition = torch.tensor([[3.0, 4.0]])  # gamma = (3, 2*4 + 1 = 9), beta = (4 + 0.5, 3)
    features = torch.tensor([[[[1.0, -1.0]], [[2.0, 0.0]]]])  # (1, 2 channels, 1, 2)
    expected = torch.tensor([[[[3 * 1 + 4.5, 3 * -1 + 4.5]], [[9 * 2 + 3.0, 9 * 0 + 3.0]]]])
    torch.testing.assert_close(film(features, condition), expected)


def test_bad_observations_are_refused_with_the_reason() -> None:
    policy = _policy()
    obs = _observations([1, 2])
    images = obs.images.clone()
    images[1, 3, 3, 1] = 6  # colours are 0..5
    with pytest.raises(ValueError, match="outside minigrid's encoding in channel 1"):
        policy(images, obs.directions, obs.missions)
    with pytest.raises(ValueError, match=r"\(batch, width, height, 3\).*\(2, 7, 7\)"):
        policy(obs.images[..., 0], obs.directions, obs.missions)
    with pytest.raises(ValueError, match="2 images, 2 directions, 1 missions"):
        policy(obs.images, obs.directions, obs.missions[:1])
    with pytest.raises(ValueError, match="needs its action words"):
        SymbolicActorCritic(SMALL, [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_inputs_on_the_cpu_run_on_the_policys_device() -> None:
    output = _policy().cuda()(**_observations([1]).inputs())
    assert output.logits.device.type == "cuda" and output.values.device.type == "cuda"


# ---------------------------------------------------------------------------------------------
# Its folder, and load_policy
# ---------------------------------------------------------------------------------------------


def test_save_and_load_give_the_same_policy(policy_folder: Path) -> None:
    meta = json.loads((policy_folder / "glam_policy.json").read_text())
    assert (meta["format_version"], meta["kind"], meta["action_words"]) == (1, "symbolic", WORDS)
    assert meta["symbolic"] == asdict(SMALL) and meta["env"] == asdict(TRAINED_ENV)
    assert sorted(p.name for p in policy_folder.iterdir()) == [
        "glam_policy.json",
        "model.safetensors",
    ]
    loaded = SymbolicActorCritic.from_pretrained(policy_folder).eval()
    obs = _observations([1, 2, 3])
    with torch.no_grad():
        expected, got = _policy()(**obs.inputs()), loaded(**obs.inputs())
    assert torch.equal(got.logits, expected.logits) and torch.equal(got.values, expected.values)
    assert loaded.cfg == SMALL and loaded.training_env == asdict(TRAINED_ENV)
    other = {"name": LEVEL, "nbr_obs": 1, "action_space": "default"}
    assert SymbolicActorCritic.from_pretrained(policy_folder, training_env=other).training_env == (
        other
    )


def _edit_meta(**changes):
    def edit(file: Path) -> None:
        meta = json.loads(file.read_text())
        file.write_text(json.dumps({**meta, **changes}))

    return edit


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[:-100])


JSON, WEIGHTS = "glam_policy.json", "model.safetensors"


@pytest.mark.parametrize(
    ("damaged", "damage", "named", "message"),
    [
        (JSON, Path.unlink, JSON, "file is missing"),
        (JSON, lambda f: f.write_text("{not json"), JSON, "not valid JSON"),
        (JSON, _edit_meta(format_version=7), JSON, "unknown format 7"),
        (JSON, _edit_meta(action_words=[]), JSON, "'action_words' must be a non-empty"),
        (JSON, _edit_meta(symbolic={"film_layers": 0}), JSON, "malformed 'symbolic'.*film_layers"),
        (JSON, _edit_meta(symbolic={"depth": 3}), JSON, "malformed 'symbolic'.*depth"),
        (WEIGHTS, Path.unlink, WEIGHTS, "file is missing"),
        (WEIGHTS, _truncate, WEIGHTS, "truncated"),
        (WEIGHTS, lambda f: f.write_bytes(b"\x00" * 64), WEIGHTS, "not a safetensors file"),
        # Settings that do not describe the saved weights.
        (
            JSON,
            _edit_meta(symbolic={**asdict(SMALL), "image_dim": 32}),
            WEIGHTS,
            "the weights do not load.*'symbolic' settings.*size mismatch",
        ),
    ],
)
def test_a_damaged_folder_is_a_checkpoint_error_naming_the_file(
    policy_folder: Path, tmp_path: Path, damaged: str, damage, named: str, message: str
) -> None:
    folder = tmp_path / "policy"
    folder.mkdir()
    for file in policy_folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    damage(folder / damaged)
    for load in (SymbolicActorCritic.from_pretrained, load_policy):
        with pytest.raises(CheckpointError, match=message) as caught:
            load(folder)
        assert str(caught.value).startswith(f"{folder / named}: ")


def test_load_policy_dispatches_on_the_kind(policy_folder: Path, tmp_path: Path, monkeypatch):
    model, tokenizer = load_model(str(save_tiny_model(tmp_path / "tiny")))
    llm = LLMActorCritic.from_model(
        model, tokenizer, ModelConfig(name_or_path=str(tmp_path / "tiny")), PolicyConfig(), WORDS
    )
    llm.save_pretrained(tmp_path / "llm")
    assert "kind" not in json.loads((tmp_path / "llm" / "glam_policy.json").read_text())
    assert policy_kind(tmp_path / "llm") == "llm"
    assert isinstance(load_policy(tmp_path / "llm"), LLMActorCritic)
    assert isinstance(load_policy(policy_folder), SymbolicActorCritic)

    drrn = tmp_path / "drrn"
    drrn.mkdir()
    (drrn / "glam_policy.json").write_text(json.dumps({"format_version": 1, "kind": "drrn"}))
    calls = []
    fake = types.ModuleType("glam.baselines.drrn")
    fake.DRRNPolicy = types.SimpleNamespace(from_pretrained=lambda *a, **k: calls.append((a, k)))
    monkeypatch.setitem(sys.modules, "glam.baselines.drrn", fake)
    load_policy(drrn, training_env={"nbr_obs": 2})
    assert calls == [((drrn,), {"training_env": {"nbr_obs": 2}})]
    monkeypatch.setitem(sys.modules, "glam.baselines.drrn", None)  # not installed
    with pytest.raises(CheckpointError, match="a 'drrn' policy needs glam.baselines.drrn"):
        load_policy(drrn)

    _edit_meta(kind="transformer-xl")(drrn / "glam_policy.json")
    with pytest.raises(CheckpointError, match="unknown policy kind 'transformer-xl'.*symbolic"):
        load_policy(drrn)


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def test_the_agent_reads_each_envs_current_grid(policy_folder: Path) -> None:
    policy = SymbolicActorCritic.from_pretrained(policy_folder).eval()
    agent = build_agent(AgentConfig(kind="checkpoint", path=str(policy_folder)), greedy=True)
    assert isinstance(agent, SymbolicAgent)
    assert (agent.trained_nbr_obs, agent.trained_action_space) == (3, "default")
    envs = [babyai_text.make(LEVEL) for _ in range(3)]
    returned = [env.reset(seed=seed)[0] for env, seed in zip(envs, [11, 12, 13], strict=True)]
    returned[1] = envs[1].step(2)[0]  # one env a step further: its view has changed
    for env, obs in zip(envs, returned, strict=True):
        current = grid_observation(env)
        assert np.array_equal(current["image"], obs["image"])
        assert (current["direction"], current["mission"]) == (obs["direction"], obs["mission"])
    request = ActRequest(
        prompts=["unused"] * 3,
        action_words=tuple(WORDS),
        envs=envs,
        slots=[0, 1, 2],
        new_episode=[True, False, True],
        rngs=[np.random.default_rng(k) for k in range(3)],
    )
    with torch.no_grad():
        logits = policy(**GridObservations.from_minigrid(returned).inputs()).logits
    assert [d.action for d in agent.act(request)] == logits.argmax(-1).tolist()
    request.action_words = ("turn left", "turn right", "go forward")
    with pytest.raises(ValueError, match="evaluate it in the action space it was trained in"):
        agent.act(request)


def test_grid_agents_skip_the_suites_that_only_change_words() -> None:
    planned = {
        name: plan_suite(
            suite,
            level=LEVEL,
            action_space="default",
            prompt_format="grid",
            probe_seeds=range(10**12, 10**12 + 20),
        )
        for name, suite in SUITES.items()
    }
    skipped = {name for name, plan in planned.items() if not plan.applies}
    assert skipped == set(SUITES) - {"no_change", "new_composition"}
    assert all("reads the grid, not the prompt" in planned[n].not_applicable for n in skipped)


def test_a_run_of_a_symbolic_policy_is_evaluated_like_an_llm_run(tmp_path: Path) -> None:
    """The trainer's checkpoint writer and checker accept a symbolic `policy/` folder, and the
    harness plays it from the run folder: the env suites, not the prompt rewrites."""
    run_dir = tmp_path / "symbolic_run" / "seed-1"
    policy = _policy()
    policy.training_env = asdict(TRAINED_ENV)
    optimizer = torch.optim.Adam(policy.parameters())
    checkpoint = save_checkpoint(
        Accelerator(cpu=True),
        run_dir,
        model=policy,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        env_state={},
        state=TrainerState(update=1),
        config_yaml=OmegaConf.to_yaml({"env": asdict(TRAINED_ENV)}),
    )
    assert check_checkpoint(checkpoint).update == 1

    suites = ["no_change", "adj_synonyms", "french", "renamed_actions", "new_composition"]
    cfg = PostTrainingTestsConfig(
        agent=AgentConfig(kind="checkpoint", path=str(run_dir)),
        eval=EvalConfig(
            suites=suites,
            episodes=3,
            num_envs=2,
            max_steps=4,
            greedy=True,
            output_dir=str(tmp_path / "eval"),
            progress_bar=False,
        ),
    )
    results, paths = evaluate(cfg)
    records = results["suites"]
    assert results["prompt_format"] == "grid" and results["label"] == "checkpoint:symbolic_run"
    ran = {name for name, record in records.items() if record["status"] == "ran"}
    assert ran == {"no_change", "new_composition"}
    assert all(records[name]["episodes"] == 3 for name in ran)
    assert records["new_composition"]["level"] == "BabyAI-PickUpSeqPickUpLocal-v0"
    # eval.level left null: the level the checkpoint was trained on, from its record
    assert cfg.eval.level == TRAINED_ENV.name == records["no_change"]["level"]
    assert trained_level(AgentConfig(kind="checkpoint", path=str(run_dir))) == TRAINED_ENV.name
    assert trained_level(AgentConfig(kind="random")) is None
    for name in set(suites) - ran:
        assert "reads the grid, not the prompt" in records[name]["reason"]
    assert len(paths["episodes"].read_text().splitlines()) == 6


def test_the_script_exits_2_naming_the_damaged_file(policy_folder: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "glam_policy.json").write_bytes((policy_folder / "glam_policy.json").read_bytes())
    failed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "post_training_tests.py"),
            "agent.kind=checkpoint",
            f"agent.path={damaged}",
            f"eval.output_dir={tmp_path / 'eval'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert failed.returncode == 2, failed.stderr
    assert f"error: {damaged / 'model.safetensors'}: file is missing" in failed.stderr
    assert not (tmp_path / "eval" / "results.json").exists()


def test_a_null_eval_level_is_the_checkpoints_training_level(tmp_path: Path, capsys) -> None:
    policy = _policy()
    policy.training_env = asdict(EnvConfig(name="BabyAI-GoToRedBall-v0", action_space="nav"))
    folder = policy.save_pretrained(tmp_path / "policy")
    checkpoint = AgentConfig(kind="checkpoint", path=str(folder))
    cfg = PostTrainingTestsConfig(agent=checkpoint, eval=EvalConfig())
    assert resolve_level(cfg) == cfg.eval.level == "BabyAI-GoToRedBall-v0"
    assert (
        "the checkpoint plays BabyAI-GoToRedBall-v0 (its training level)" in capsys.readouterr().out
    )
    given = PostTrainingTestsConfig(agent=checkpoint, eval=EvalConfig(level="BabyAI-GoToLocal-v0"))
    assert resolve_level(given) == "BabyAI-GoToLocal-v0"  # a level the user gives is kept
    other = PostTrainingTestsConfig(agent=AgentConfig(kind="random"), eval=EvalConfig())
    assert resolve_level(other) == DEFAULT_LEVEL == "BabyAI-MixedTrainLocal-v0"
