"""Cloning the policy's choice (glam/bc/choice.py): its loss is the cross-entropy of real
log-probabilities at the policy's temperature, the cached trunk gives the whole model's numbers,
the saved policy plays and warm-starts PPO with the weights it learnt, a killed clone continues
from its last epoch to the uninterrupted numbers, bad input is refused."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from helpers_tiny import save_tiny_model
from safetensors.torch import load_file

from glam.bc import choice
from glam.bc.choice import (
    CHECKPOINT_FOLDER,
    CloneResumeError,
    DecisionSet,
    clone_policy,
    measure,
)
from glam.bc.choice import _save_checkpoint as save_checkpoint
from glam.bc.config import CloneConfig, CloneRunConfig
from glam.config import AdapterConfig, ModelConfig, PolicyConfig
from glam.demos import DemoDatasetError, load_demos, split_pairs
from glam.models.loading import load_model
from glam.outputs import OutputDirError, OutputExistsError
from glam.policy.adapters import apply_lora
from glam.policy.llm_policy import LLMActorCritic
from glam.scoring import score_actions_naive

LEVEL = "BabyAI-GoToRedBall-v0"


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture(scope="module")
def demos(redball_demos: Path) -> Path:
    """8 GoToRedBall bot episodes, one observation, the three navigation actions."""
    return redball_demos


def _run(tiny: Path, demos: Path, out: Path, **clone: object) -> CloneRunConfig:
    settings = {"epochs": 1, "batch_size": 4, "max_eval_pairs": 12, "progress": False, **clone}
    return CloneRunConfig(
        model=ModelConfig(name_or_path=str(tiny), lora=AdapterConfig(layers=1)),
        policy=PolicyConfig(temperature=2.0, value_hidden_sizes=[8]),
        clone=CloneConfig(dataset=str(demos), output_dir=str(out), **settings),
    )


def _rows(folder: Path) -> list[dict[str, float]]:
    with (folder / "clone.csv").open() as handle:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def test_the_loss_is_the_cross_entropy_of_the_softmax_of_naive_scores(
    tiny: Path, demos: Path, tmp_path: Path
) -> None:
    result = clone_policy(_run(tiny, demos, tmp_path / "out", learning_rate=1e-2))
    zero_shot = _rows(tmp_path / "out")[0]

    # Before any step the adapter is the identity: the held-out loss is the base model's, from
    # one unbatched forward per (prompt, action), at the policy's temperature 2.
    pairs = load_demos(demos)
    _, held_out = split_pairs(pairs, 0.2, seed=0)
    held_out = held_out.select(range(12))
    model, tokenizer = load_model(str(tiny))
    words = result.summary["action_words"]
    scores = torch.stack(
        score_actions_naive(model, tokenizer, list(held_out["prompt"]), [words] * 12)
    )
    targets = torch.tensor([words.index(a) for a in held_out["action"]])
    log_probs = (scores / 2.0).log_softmax(dim=-1)
    expected = -log_probs[torch.arange(12), targets].mean().item()
    assert zero_shot["eval_loss"] == pytest.approx(expected, rel=1e-5)
    accuracy = (scores.argmax(-1) == targets).float().mean().item()
    assert zero_shot["eval_accuracy"] == pytest.approx(accuracy)
    assert zero_shot["eval_target_probability"] == pytest.approx(
        log_probs[torch.arange(12), targets].exp().mean().item(), rel=1e-5
    )

    summary = json.loads((tmp_path / "out" / "clone.json").read_text())
    counts = torch.bincount(targets, minlength=3)
    assert summary["majority_accuracy"] == pytest.approx(counts.max().item() / 12)
    assert summary["train_pairs"] == len(pairs) - len(split_pairs(pairs, 0.2, seed=0)[1])
    assert summary["held_out_targets"] == targets.tolist()
    assert summary["zero_shot_choices"] == scores.argmax(-1).tolist()
    trained = _rows(tmp_path / "out")[1]
    assert trained["optimizer_steps"] == -(-summary["train_pairs"] // 4)
    assert trained["eval_loss"] != zero_shot["eval_loss"]  # the adapter moved


def test_the_cached_trunk_gives_the_whole_model_numbers(
    tiny: Path, demos: Path, tmp_path: Path
) -> None:
    cached = clone_policy(_run(tiny, demos, tmp_path / "cached", learning_rate=1e-2))
    whole = clone_policy(
        _run(tiny, demos, tmp_path / "whole", learning_rate=1e-2, cache_trunk=False)
    )
    assert cached.summary["trunk_seconds"] >= 0 and math.isnan(whole.summary["trunk_seconds"])
    for a, b in zip(_rows(cached.output_dir), _rows(whole.output_dir), strict=True):
        for key in ("train_loss", "eval_loss", "eval_target_probability", "eval_accuracy"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6, nan_ok=True), key
    adapter = "policy/adapter/adapter_model.safetensors"
    one = load_file(cached.output_dir / adapter)
    other = load_file(whole.output_dir / adapter)
    assert one.keys() == other.keys()
    for key in one:
        torch.testing.assert_close(one[key], other[key], rtol=1e-4, atol=1e-6)


def test_the_saved_policy_plays_and_warm_starts_with_what_it_learnt(
    tiny: Path, demos: Path, tmp_path: Path
) -> None:
    result = clone_policy(_run(tiny, demos, tmp_path / "out", learning_rate=1e-2))
    policy = LLMActorCritic.from_pretrained(tmp_path / "out" / "policy")
    assert policy.training_env["name"] == LEVEL and policy.training_env["nbr_obs"] == 1
    assert policy.policy_cfg.temperature == 2.0

    _, held_out = split_pairs(load_demos(demos), 0.2, seed=0)
    decisions = DecisionSet.from_pairs(held_out.select(range(12)), tuple(policy.action_words))
    found = measure(policy, decisions, batch_size=5)
    final = result.summary["final"]
    assert found["loss"] == pytest.approx(final["eval_loss"], rel=1e-5)
    assert found["accuracy"] == pytest.approx(final["eval_accuracy"])

    # PPO's warm start (`model.lora.init`) reads the policy's adapter folder.
    base, _ = load_model(str(tiny))
    warm = apply_lora(base, AdapterConfig(layers=1, init=str(tmp_path / "out/policy/adapter")))
    saved = load_file(tmp_path / "out/policy/adapter/adapter_model.safetensors")
    state = {k.replace(".default", ""): v for k, v in warm.state_dict().items() if "lora_" in k}
    assert state.keys() == saved.keys() and saved
    for key, value in saved.items():
        assert torch.equal(state[key], value), key


def test_bad_input_is_refused(tiny: Path, demos: Path, tmp_path: Path) -> None:
    run = _run(tiny, demos, tmp_path / "out")
    run.policy.prompt_format = "chat"
    with pytest.raises(DemoDatasetError, match="prompt_format"):
        clone_policy(run)
    with pytest.raises(ValueError, match="policy.kind"):
        CloneRunConfig(policy=PolicyConfig(kind="drrn"))

    done = clone_policy(_run(tiny, demos, tmp_path / "out"))
    with pytest.raises(OutputExistsError, match="clone.overwrite"):
        clone_policy(_run(tiny, demos, tmp_path / "out"))
    assert (done.output_dir / "clone.json").is_file()  # the refused run left it as it was

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").write_text("update\n")
    with pytest.raises(OutputDirError, match="training run"):
        clone_policy(_run(tiny, demos, tmp_path / "run"))


def test_a_killed_clone_continues_to_the_uninterrupted_numbers(
    tiny: Path, demos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = clone_policy(_run(tiny, demos, tmp_path / "whole", epochs=3, learning_rate=1e-2))
    assert not (whole.output_dir / CHECKPOINT_FOLDER).exists()  # removed once finished

    saved = []

    def killed_after_the_second_epoch(*args: object) -> None:
        save_checkpoint(*args)
        saved.append(True)
        if len(saved) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(choice, "_save_checkpoint", killed_after_the_second_epoch)
    killed = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        clone_policy(_run(tiny, demos, killed, epochs=3, learning_rate=1e-2))
    monkeypatch.undo()
    assert (killed / CHECKPOINT_FOLDER / "progress.json").is_file()
    assert not (killed / "clone.json").exists() and len(_rows(killed)) == 3

    with pytest.raises(OutputExistsError, match="clone.resume=true continues an unfinished"):
        clone_policy(_run(tiny, demos, killed, epochs=3, learning_rate=1e-2))
    with pytest.raises(CloneResumeError, match="clone.learning_rate: 0.01 then, 0.005 now"):
        clone_policy(_run(tiny, demos, killed, epochs=3, learning_rate=5e-3, resume=True))
    resumed = clone_policy(_run(tiny, demos, killed, epochs=3, learning_rate=1e-2, resume=True))
    assert not (killed / CHECKPOINT_FOLDER).exists()
    for a, b in zip(_rows(whole.output_dir), _rows(killed), strict=True):
        for key in ("epoch", "optimizer_steps", "train_loss", "eval_loss", "eval_accuracy"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, nan_ok=True), key
    assert resumed.summary["final_choices"] == whole.summary["final_choices"]
    assert resumed.summary["zero_shot_choices"] == whole.summary["zero_shot_choices"]
    adapter = "policy/adapter/adapter_model.safetensors"
    one, other = load_file(whole.output_dir / adapter), load_file(killed / adapter)
    for key in one:
        torch.testing.assert_close(one[key], other[key], rtol=1e-6, atol=1e-8)

    again = clone_policy(_run(tiny, demos, killed, epochs=3, learning_rate=1e-2, resume=True))
    assert again.summary == json.loads((killed / "clone.json").read_text())
