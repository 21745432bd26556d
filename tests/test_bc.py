"""Behavioural cloning with TRL: the loss is on the action tokens only (exactly those the policy's
scorer scores), a tiny model learns above chance, the saved policy loads back, and the script
refuses bad datasets clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from helpers_tiny import save_tiny_model, tiny_causal_lm, tiny_seq2seq_lm
from peft import LoraConfig, get_peft_model

from babyai_text.actions import get_action_space
from glam.bc.bot import collect_bot_demos
from glam.bc.config import (
    BCConfig,
    BCRunConfig,
    CollectDemosConfig,
    DemosConfig,
)
from glam.bc.sft import (
    ActionSFTTrainer,
    HeldOutActions,
    action_accuracy,
    build_sft_config,
    dataset_action_space,
    encode_pairs,
    train_bc,
)
from glam.config import CONFIG_DIR, AdapterConfig, ConfigError, ModelConfig, compose_config
from glam.demos import DemoDatasetError, load_demos, split_pairs, write_demos
from glam.models.loading import load_model
from glam.policy.bc_policy import BCPolicyInfo, load_bc_policy, read_bc_policy_info
from glam.scoring import score_actions, tokenize_candidates

ROOT = Path(__file__).resolve().parents[1]
ACTIONS = get_action_space("default")
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}
"""Tiny models gain nothing from threads, and on a busy shared CPU they lose 10x or more."""


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def demos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """30 GoToLocal bot episodes (about 150 pairs) with one observation per prompt."""
    records, _ = collect_bot_demos(DemosConfig(episodes=30, seed=0, nbr_obs=1))
    folder = tmp_path_factory.mktemp("bc") / "demos"
    write_demos(records, folder, metadata={"nbr_obs": 1, "level": "BabyAI-GoToLocal-v0"})
    return folder


@pytest.fixture(scope="module")
def demos(demos_dir: Path) -> Dataset:
    return load_demos(demos_dir)


def _trainer(model, tokenizer, pairs: Dataset, tmp_path: Path) -> ActionSFTTrainer:
    run = BCRunConfig(bc=BCConfig(output_dir=str(tmp_path), batch_size=4, max_steps=1))
    encoded = encode_pairs(
        pairs,
        tokenizer,
        is_encoder_decoder=bool(model.config.is_encoder_decoder),
        max_length=run.bc.max_length,
    )
    return ActionSFTTrainer(
        model=model,
        args=build_sft_config(run, tmp_path),
        train_dataset=encoded,
        processing_class=tokenizer,
    )


@pytest.mark.parametrize("arch", ["llama", "t5"])
def test_labels_are_the_scorer_action_tokens_and_nothing_else(
    arch: str, demos: Dataset, tmp_path: Path
) -> None:
    model, tokenizer = tiny_seq2seq_lm() if arch == "t5" else tiny_causal_lm("llama")
    pairs = demos.select(range(6))  # prompts of different lengths: the batch is padded
    trainer = _trainer(model, tokenizer, pairs, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(pairs))])

    tokens = tokenize_candidates(
        tokenizer,
        pairs["prompt"],
        [[action] for action in pairs["action"]],
        encoder_decoder=arch == "t5",
    )
    assert len(set(tokens.prompt_lengths.tolist())) > 1
    for row in range(len(pairs)):
        prompt = tokens.prompt_ids[row, : tokens.prompt_lengths[row]].tolist()
        action = tokens.candidate_ids[row, : tokens.candidate_lengths[row]].tolist()
        assert tokenizer.eos_token_id not in action
        labels = batch["labels"][row].tolist()
        real = batch["attention_mask"][row].bool()
        if arch == "t5":  # prompt in the encoder, the action alone as the decoder's targets
            assert batch["input_ids"][row][real].tolist() == prompt
            assert labels == action + [-100] * (len(labels) - len(action))
        else:
            assert batch["input_ids"][row][real].tolist() == prompt + action
            padding = len(labels) - len(prompt) - len(action)
            assert labels == [-100] * len(prompt) + action + [-100] * padding
    assert (~batch["attention_mask"].bool()).any()  # some padding was masked, not just checked

    # The training loss is exactly the scorer's negative log-likelihood per action token.
    model.eval()
    with torch.no_grad():
        loss = trainer.compute_loss(trainer.model, {k: v for k, v in batch.items()})
        candidates = [list(ACTIONS.words)] * len(pairs)
        scores = torch.stack(score_actions(model, tokenizer, pairs["prompt"], candidates))
    targets = torch.tensor([ACTIONS.index(a) for a in pairs["action"]])
    log_likelihood = scores.gather(1, targets[:, None]).sum()
    torch.testing.assert_close(
        loss, -log_likelihood / tokens.candidate_lengths.sum(), rtol=1e-4, atol=1e-4
    )


def test_split_holds_out_whole_episodes(demos: Dataset) -> None:
    train, held_out = split_pairs(demos, 0.2, seed=0)
    assert len(train) + len(held_out) == len(demos)
    assert not set(train["episode"]) & set(held_out["episode"])
    assert len(set(held_out["episode"])) == 6
    assert split_pairs(demos, 0.2, seed=0)[1]["prompt"] == held_out["prompt"]
    with pytest.raises(DemoDatasetError, match="cannot split"):
        split_pairs(demos.filter(lambda row: row["episode"] == 0), 0.2, seed=0)


def test_actions_outside_the_action_space_are_refused(demos: Dataset) -> None:
    assert dataset_action_space(demos).name == "default"
    renamed = demos.map(lambda row: {"action": "jump"} if row["step"] == 0 else {})
    with pytest.raises(DemoDatasetError, match="'jump'"):
        dataset_action_space(renamed)


@pytest.mark.slow
def test_tiny_model_learns_above_chance_and_its_saved_policy_loads(
    demos_dir: Path, tmp_path: Path
) -> None:
    model_dir = save_tiny_model(tmp_path / "model", "llama")
    run = BCRunConfig(
        model=ModelConfig(name_or_path=str(model_dir), lora=AdapterConfig(enabled=False)),
        bc=BCConfig(
            dataset=str(demos_dir),
            output_dir=str(tmp_path / "bc"),
            learning_rate=1e-2,
            epochs=4,
            batch_size=8,
            progress=False,
        ),
    )
    before = sorted(path.name for path in demos_dir.iterdir())
    metrics = train_bc(run).metrics
    # The dataset's folder is left as it was: no cache file to block `demos.overwrite` later.
    assert sorted(path.name for path in demos_dir.iterdir()) == before

    chance = metrics["data/chance_accuracy"]
    assert metrics["eval/action_accuracy"] >= chance + 0.25
    assert metrics["eval/action_accuracy"] > metrics["eval/zero_shot_action_accuracy"]
    assert metrics["eval/loss"] < metrics["eval/zero_shot_loss"]

    # The folder reloads as the same policy: same held-out accuracy, different from the base.
    model, tokenizer = load_bc_policy(tmp_path / "bc")
    info = read_bc_policy_info(tmp_path / "bc")
    assert (info.adapter, info.nbr_obs, info.action_space) == (False, 1, "default")
    held_out = HeldOutActions.from_dataset(
        split_pairs(load_demos(demos_dir), 0.2, seed=0)[1], ACTIONS, limit=200
    )
    assert action_accuracy(model, tokenizer, held_out) == metrics["eval/action_accuracy"]


@pytest.mark.slow
def test_encoder_decoder_lora_trains_and_reloads(demos_dir: Path, tmp_path: Path) -> None:
    model_dir = save_tiny_model(tmp_path / "model", "t5")
    run = BCRunConfig(
        model=ModelConfig(name_or_path=str(model_dir)),  # LoRA on q, v
        bc=BCConfig(
            dataset=str(demos_dir),
            output_dir=str(tmp_path / "bc"),
            learning_rate=5e-2,
            max_steps=4,
            max_eval_pairs=16,
            eval_before_training=False,
            progress=False,
        ),
    )
    metrics = train_bc(run).metrics
    assert metrics["train/steps"] == 4 and torch.isfinite(torch.tensor(metrics["train/loss"]))
    assert (tmp_path / "bc" / "adapter_config.json").is_file()

    trained, tokenizer = load_bc_policy(tmp_path / "bc")
    base, _ = load_model(str(model_dir))
    prompts = ["Goal of the agent: go to the red ball\nObservation 0: You see a wall,\nAction 0:"]
    candidates = [list(ACTIONS.words)]
    with torch.no_grad():
        after = score_actions(trained, tokenizer, prompts, candidates)[0]
        before = score_actions(base, tokenizer, prompts, candidates)[0]
    assert not torch.allclose(after, before)  # the adapter was saved and is applied


def _bc_script(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/clm_behavioral_cloning.py", "bc.progress=false", *overrides],
        cwd=ROOT,
        env=ONE_THREAD,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_script_trains_a_tiny_model_and_saves_a_bc_folder(demos_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bc"
    done = _bc_script(
        "model.name_or_path=tiny-random-llama",
        f"bc.dataset={demos_dir}",
        f"bc.output_dir={out}",
        "bc.max_steps=2",
        "bc.max_eval_pairs=8",
        "bc.success_episodes=2",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["train/steps"] == 2
    assert 0.0 <= metrics["eval/success_rate"] <= 1.0
    assert "eval/zero_shot_success_rate" in metrics
    info = read_bc_policy_info(out)
    assert info.adapter and info.base_model == "tiny-random-llama"
    assert info.level == "BabyAI-GoToLocal-v0"
    assert "max_steps: 2" in (out / "config.yaml").read_text()

    # A second run into the same folder is refused, and leaves the first policy as it was...
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    common = ["model.name_or_path=tiny-random-llama", f"bc.dataset={demos_dir}"]
    again = _bc_script(*common, f"bc.output_dir={out}", "bc.max_steps=3", "bc.max_eval_pairs=8")
    assert again.returncode == 2
    assert f"bc.output_dir='{out}' already holds results (bc_policy.json" in again.stderr
    assert "pass bc.overwrite=true" in again.stderr
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    # ... unless told to replace it.
    replaced = _bc_script(
        *common,
        f"bc.output_dir={out}",
        "bc.max_steps=3",
        "bc.max_eval_pairs=8",
        "bc.overwrite=true",
    )
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["train/steps"] == 3


@pytest.mark.slow
def test_script_refuses_bad_datasets_with_a_clear_message(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    no_action = tmp_path / "no_action"
    Dataset.from_dict({"prompt": ["Action 0:"], "completion": ["drop"]}).save_to_disk(no_action)

    for folder, message in ((empty, "is empty"), (no_action, "lacks the column(s) ['action']")):
        done = _bc_script(f"bc.dataset={folder}", f"bc.output_dir={tmp_path / 'out'}")
        assert done.returncode == 2, done.stderr[-2000:]
        assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("preset", "schema", "misspelt", "invalid"),
    [
        ("bc/train", BCRunConfig, "bc.lerning_rate=1e-3", "bc.eval_fraction=1.5"),
        ("demos/collect", CollectDemosConfig, "demos.episods=3", "demos.level=BabyAI-KeyInBox-v0"),
    ],
)
def test_presets_fill_the_schemas_and_reject_misspelt_or_invalid_keys(
    preset: str, schema: type, misspelt: str, invalid: str
) -> None:
    folder, name = preset.split("/")
    config_dir = CONFIG_DIR / folder
    assert isinstance(compose_config(name, [], schema, config_dir), schema)
    for override in (misspelt, f"+{misspelt}"):  # `+` adds the key: refused all the same
        with pytest.raises(ConfigError, match=f"unknown key {misspelt.split('=')[0]}"):
            compose_config(name, [override], schema, config_dir)
    with pytest.raises(ConfigError, match=invalid.split("=")[0]):
        compose_config(name, [invalid], schema, config_dir)


def test_a_folder_holding_a_policy_is_refused_before_anything_loads(tmp_path: Path) -> None:
    out = tmp_path / "bc"
    out.mkdir()
    (out / "bc_policy.json").write_text("{}")
    run = BCRunConfig(bc=BCConfig(dataset=str(tmp_path / "no-demos"), output_dir=str(out)))
    with pytest.raises(FileExistsError) as refused:
        train_bc(run)
    assert str(refused.value) == (
        f"bc.output_dir='{out}' already holds results (bc_policy.json): pass bc.overwrite=true "
        "to replace them, or choose another bc.output_dir"
    )
    run.bc.overwrite = True
    with pytest.raises(DemoDatasetError):  # past the folder check, on to the (missing) dataset
        train_bc(run)


def test_overwrite_never_replaces_a_training_run_s_files(tmp_path: Path) -> None:
    """`bc.overwrite=true` into a run folder once replaced the run's config.yaml."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("ppo: {lr: 0.001}\n")
    (run_dir / "metrics.csv").write_text("update,frames\n1,8\n")
    bc = BCConfig(dataset=str(tmp_path / "no-demos"), output_dir=str(run_dir), overwrite=True)
    with pytest.raises(ValueError, match=r"holds a training run \(checkpoints, metrics.csv\)"):
        train_bc(BCRunConfig(bc=bc))
    assert (run_dir / "config.yaml").read_text() == "ppo: {lr: 0.001}\n"


def test_an_output_path_that_is_a_file_stops_bc_before_the_dataset_or_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("worked before checking bc.output_dir")

    monkeypatch.setattr("glam.bc.sft.load_demos", no_work)
    monkeypatch.setattr("glam.bc.sft.load_model", no_work)
    file = tmp_path / "bc"
    file.write_text("not a folder")
    bc = BCConfig(dataset=str(tmp_path / "demos"), output_dir=str(file), overwrite=True)
    with pytest.raises(ValueError, match=r"bc.output_dir='.*bc' is a file, not a folder"):
        train_bc(BCRunConfig(bc=bc))


def test_code_a_bc_folder_names_never_runs_without_trust_remote_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BC folder's tokenizer_config.json that auto_maps a .py file made transformers ask
    "run custom code? [y/N]", and a "y" ran it: the load now says no by itself."""
    base = save_tiny_model(tmp_path / "base")
    model, tokenizer = load_model(str(base))
    folder = tmp_path / "bc"
    lora = LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    BCPolicyInfo(base_model=str(base), adapter=True).save(folder)
    ran = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config |= {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil.X", None]}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    monkeypatch.setattr("builtins.input", lambda *args: "y")  # a user answering the prompt
    with pytest.raises(ValueError, match="custom code"):
        load_bc_policy(folder)
    assert not ran.exists()
