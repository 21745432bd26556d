"""Bot demonstrations: the dataset schema round-trips, collection is seeded and replays, and bad
input (unknown or unsupported level, an existing folder, a broken dataset) fails clearly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset, load_from_disk
from helpers_tiny import tiny_tokenizer

import babyai_text
from babyai_text.levels import TASK_TYPES
from glam.bc.bot import BotUnsupportedError, collect_bot_demos, save_bot_demos
from glam.bc.config import DemosConfig
from glam.demos import (
    DEMO_COLUMNS,
    DemoDatasetError,
    DemoRecord,
    DemoWriter,
    demo_features,
    demo_metadata,
    load_demos,
    write_demos,
)
from glam.policy.prompts import glam_prompt

ROOT = Path(__file__).resolve().parents[1]


def _record(episode: int, step: int, action: str = "go forward") -> DemoRecord:
    return DemoRecord(
        prompt=f"Goal of the agent: go to the red ball\nAction {step}:",
        action=action,
        action_index=babyai_text.get_action_space("default").index(action),
        action_space="default",
        mission="go to the red ball",
        task_type="goto" if episode % 2 else None,
        level="BabyAI-GoToLocal-v0",
        episode=episode,
        seed=100 + episode,
        step=step,
        success=bool(episode % 2),
        source="bot",
    )


def test_dataset_round_trips_through_disk(tmp_path: Path) -> None:
    records = [_record(episode, step) for episode in range(3) for step in range(2)]
    written = write_demos(records, tmp_path / "demos", metadata={"nbr_obs": 3})

    loaded = load_from_disk(str(tmp_path / "demos"))
    assert loaded.to_list() == [vars(record) for record in records]
    assert loaded.features == demo_features()
    assert tuple(loaded.column_names) == DEMO_COLUMNS
    assert written.to_list() == loaded.to_list()
    assert demo_metadata(loaded) == {"nbr_obs": 3}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp folder left


def test_writer_writes_nothing_when_collection_crashes(tmp_path: Path) -> None:
    folder = tmp_path / "demos"
    with pytest.raises(RuntimeError), DemoWriter(folder) as writer:
        writer.add(_record(0, 0))
        raise RuntimeError("the collector crashed")
    assert not folder.exists()
    with DemoWriter(folder) as writer:
        writer.extend([_record(0, 0), _record(0, 1)])
    assert len(load_demos(folder)) == 2
    with pytest.raises(FileExistsError, match="already holds a demonstrations dataset"):
        DemoWriter(folder)  # refused before any collection
    write_demos([_record(1, 0)], folder, overwrite=True)
    assert len(load_demos(folder)) == 1


def test_writer_rejects_rows_that_do_not_fit_the_schema(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lacks"):
        write_demos([{"prompt": "p", "action": "drop"}], tmp_path / "a")
    with pytest.raises(ValueError, match="unknown fields"):
        write_demos([{**vars(_record(0, 0)), "reward": 1.0}], tmp_path / "b")
    with pytest.raises(ValueError, match="no demonstrations"):
        write_demos([], tmp_path / "c")


@pytest.mark.parametrize(
    ("make_folder", "message"),
    [
        (lambda path: None, "no demonstrations folder"),
        (lambda path: path.mkdir(), "is empty"),
        (lambda path: (path.mkdir(), (path / "notes.txt").write_text("hi")), "not a dataset"),
        (
            lambda path: Dataset.from_dict({"prompt": ["p"], "completion": ["drop"]}).save_to_disk(
                str(path)
            ),
            r"lacks the column\(s\) \['action'\]",
        ),
        (
            lambda path: Dataset.from_dict({"prompt": [], "action": []}).save_to_disk(str(path)),
            "has no rows",
        ),
    ],
    ids=["missing", "empty", "not-a-dataset", "no-action-column", "no-rows"],
)
def test_load_demos_says_what_is_wrong(tmp_path: Path, make_folder, message: str) -> None:
    folder = tmp_path / "demos"
    make_folder(folder)
    with pytest.raises(DemoDatasetError, match=message):
        load_demos(folder)


def test_bot_demos_are_seeded_and_in_the_policy_prompt_format() -> None:
    config = DemosConfig(level="BabyAI-GoToLocal-v0", episodes=4, seed=7, nbr_obs=2)
    records, stats = collect_bot_demos(config)
    again, _ = collect_bot_demos(config)
    other, _ = collect_bot_demos(DemosConfig(level="BabyAI-GoToLocal-v0", episodes=4, seed=8))

    assert records == again
    assert [r.prompt for r in records] != [r.prompt for r in other]
    assert stats == {
        "episodes_played": 4,
        "episodes_solved": 4,
        "episodes_kept": 4,
        "pairs": len(records),
    }
    assert [r.seed for r in records if r.step == 0] == [7, 8, 9, 10]

    # Replaying one episode by hand gives exactly the recorded prompts (nbr_obs=2 history)...
    episode = [r for r in records if r.episode == 1]
    env = babyai_text.make("BabyAI-GoToLocal-v0")
    obs, info = env.reset(seed=episode[0].seed)
    observations, actions = [info["descriptions"]], []
    for record in episode:
        expected = glam_prompt(obs["mission"], env.action_words, observations[-2:], actions[-1:])
        assert record.prompt == expected
        assert record.prompt.endswith(f"Action {min(record.step, 1)}:")
        assert env.action_words[record.action_index] == record.action
        obs, _, terminated, _, info = env.step(record.action_index)
        observations.append(info["descriptions"])
        actions.append(record.action)
    # ... and the bot's actions solve it.
    assert terminated and info["success"] and all(r.success for r in episode)


def test_pairs_mode_stops_at_exactly_that_many_pairs() -> None:
    records, stats = collect_bot_demos(DemosConfig(level="BabyAI-GoToLocal-v0", pairs=11))
    assert len(records) == 11 == stats["pairs"]
    assert stats["episodes_played"] >= 2


def test_mixed_level_records_each_episode_task_type() -> None:
    config = DemosConfig(level="BabyAI-MixedTrainLocal-v0", episodes=12)
    records, _ = collect_bot_demos(config)
    assert len({r.task_type for r in records}) >= 3
    assert {r.task_type for r in records} <= set(TASK_TYPES)


def test_unsupported_levels_and_a_failing_bot_are_clear_errors(monkeypatch) -> None:
    with pytest.raises(ValueError, match="BabyAI-KeyInBox-v0: BabyAI's bot cannot solve it"):
        DemosConfig(level="BabyAI-KeyInBox-v0", episodes=1)
    with pytest.raises(ValueError, match="unknown BabyAI level id"):
        collect_bot_demos(DemosConfig(level="BabyAI-NoSuchLevel-v0", episodes=1))

    def give_up(self, action_taken=None):
        raise AssertionError("nothing left to explore")

    monkeypatch.setattr("glam.bc.bot.BabyAIBot.replan", give_up)
    with pytest.raises(BotUnsupportedError, match="solved 0 of 10 episodes.*nothing left"):
        collect_bot_demos(DemosConfig(level="BabyAI-GoToLocal-v0", episodes=50))


def _training_run(folder: Path) -> Path:
    """A run folder as the trainer leaves it (what matters here: its files)."""
    (folder / "checkpoints" / "update_000001").mkdir(parents=True)
    (folder / "checkpoints" / "update_000001" / "optimizer.pt").write_bytes(b"moments")
    (folder / "config.yaml").write_text("train: {seed: 1}\n")
    (folder / "metrics.csv").write_text("update,frames\n1,8\n")
    return folder


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_overwrite_never_deletes_a_training_run(tmp_path: Path) -> None:
    """`demos.overwrite=true` once replaced whatever folder it was given: a training run,
    checkpoints and all."""
    run = _training_run(tmp_path / "run")
    before = _files(run)
    with pytest.raises(ValueError, match="holds a training run .* never replaces"):
        DemoWriter(run, overwrite=True)
    with pytest.raises(ValueError, match="holds a training run .* never replaces"):
        write_demos([_record(0, 0)], run, overwrite=True)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"is not empty \(todo.txt\) and holds no demonstr"):
        write_demos([_record(0, 0)], notes, overwrite=True)
    assert _files(run) == before and _files(notes) == {"todo.txt": b"mine"}


def test_the_output_folder_is_checked_before_the_model_and_the_episodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file where the dataset goes was found only after every episode ran."""

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("worked before checking the output folder")

    monkeypatch.setattr("glam.bc.bot.collect_bot_demos", no_work)
    monkeypatch.setattr("glam.bc.bot.load_model", no_work)
    file = tmp_path / "demos"
    file.write_text("not a folder")
    config = DemosConfig(
        output_dir=str(file), overwrite=True, prompt_format="chat", chat_model="tiny-random-llama"
    )
    with pytest.raises(ValueError, match=r"demos.output_dir='.*demos' is a file, not a folder"):
        save_bot_demos(config, progress=False)


def _collect(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/collect_bot_demos.py", "progress=false", *overrides],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_collect_script_writes_a_loadable_dataset_and_refuses_bad_input(tmp_path: Path) -> None:
    folder = tmp_path / "demos"
    done = _collect("demos.episodes=3", f"demos.output_dir={folder}")
    assert done.returncode == 0, done.stderr
    dataset = load_from_disk(str(folder))
    assert {"prompt", "action", "mission", "task_type", "episode", "step"} <= set(dataset.features)
    assert "pairs from 3 episodes of BabyAI-GoToLocal-v0" in done.stdout
    assert str(folder) in done.stdout

    again = _collect("demos.episodes=3", f"demos.output_dir={folder}")
    assert again.returncode == 2
    assert f"demos.output_dir='{folder}' already holds a demonstrations dataset (" in again.stderr
    assert "): pass demos.overwrite=true" in again.stderr

    unsupported = _collect("demos.level=BabyAI-KeyInBox-v0", f"demos.output_dir={tmp_path / 'x'}")
    assert unsupported.returncode == 1  # a bad config
    assert "invalid configuration: demos.level=BabyAI-KeyInBox-v0" in unsupported.stderr
    assert "cannot solve" in unsupported.stderr and "Traceback" not in unsupported.stderr
    assert not (tmp_path / "x").exists()


def test_chat_format_demos_wrap_the_glam_prompt_in_the_template() -> None:
    config = DemosConfig(episodes=2, prompt_format="chat", chat_model="tiny", nbr_obs=2)
    records, _ = collect_bot_demos(config, tokenizer=tiny_tokenizer())
    glam_records, _ = collect_bot_demos(DemosConfig(episodes=2, nbr_obs=2))
    for chat, glam in zip(records, glam_records, strict=True):
        assert chat.prompt.startswith("<s>user\n") and chat.prompt.endswith("<s>assistant\n")
        assert glam.prompt in chat.prompt and chat.action == glam.action


def test_a_dataset_with_the_cache_files_of_a_map_in_place_is_replaced(tmp_path: Path) -> None:
    """`datasets` writes `cache-*.arrow` beside a dataset mapped in place (behavioural cloning
    did, before it read its dataset into memory): they are the dataset's, replaced with it."""
    folder = tmp_path / "demos"
    write_demos([_record(0, 0)], folder)
    (folder / "cache-0123456789abcdef.arrow").write_bytes(b"arrow")
    write_demos([_record(1, 0), _record(1, 1)], folder, overwrite=True)
    assert not list(folder.glob("cache-*.arrow")) and len(load_demos(folder)) == 2
