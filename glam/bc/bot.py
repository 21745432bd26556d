"""Roll BabyAI's bot through BabyAI-Text envs and record its decisions as demonstrations.

minigrid's `BabyAIBot` plans on the grid; each step it proposes a minigrid action, which is mapped
to the action space's word. The prompt recorded with it is the policy's own
(`glam.policy.prompts`), built from the same observation history the policy would have seen, so a
model cloned on these pairs is trained on exactly the text it reads when it acts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from datasets import Dataset
from minigrid.core.actions import Actions
from minigrid.utils.baby_ai_bot import BabyAIBot
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PreTrainedTokenizerBase

import babyai_text
from glam.bc.config import BOT_UNSUPPORTED_LEVELS, DemosConfig
from glam.demos import DemoRecord, DemoWriter
from glam.envs import record_episode
from glam.models.loading import load_model

__all__ = [
    "BOT_UNSUPPORTED_LEVELS",
    "BotEpisode",
    "BotUnsupportedError",
    "collect_bot_demos",
    "play_bot_episode",
    "save_bot_demos",
]


class BotUnsupportedError(ValueError):
    """The bot cannot play this level (unknown instruction) or fails too many of its episodes."""


@dataclass
class BotEpisode:
    """The bot's decisions in one episode."""

    records: list[DemoRecord]
    success: bool
    error: str | None = None
    """Why the bot gave up, when it did (it signals that by raising)."""


def _make_bot(env: babyai_text.TextEnv, level: str) -> BabyAIBot:
    try:
        return BabyAIBot(env.unwrapped)
    except (AssertionError, AttributeError) as error:
        raise BotUnsupportedError(
            f"BabyAI's bot cannot play {level}: its instruction is not one the bot knows "
            f"(GoTo, Open, PickUp, PutNext and their sequences) ({error!r})"
        ) from None


def play_bot_episode(
    env: babyai_text.TextEnv,
    *,
    level: str,
    seed: int,
    episode: int,
    nbr_obs: int,
    prompt_format: str = "glam",
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> BotEpisode:
    """Play one episode with the bot from `env.reset(seed=seed)`; return its decisions.

    `prompt_format` and `tokenizer` are those of `PromptHistory.prompt` (`chat` needs the
    tokenizer whose chat template renders the prompt).

    Raises:
        BotUnsupportedError: the bot does not understand the level's instruction.
    """
    errors: list[str] = []
    bot: BabyAIBot | None = None
    space = env.action_space_def

    def choose(step: int) -> int | None:
        nonlocal bot
        if bot is None:  # after the reset record_episode makes
            bot = _make_bot(env, level)
        try:
            action = int(bot.replan())
        except Exception as bot_error:  # the bot gives up by raising (assertions, box opened...)
            errors.append(f"{type(bot_error).__name__}: {bot_error}")
            return None
        if action == Actions.done or action not in space.minigrid_actions:
            errors.append(f"the bot chose minigrid action {action}, which {space.name!r} lacks")
            return None
        return space.minigrid_actions.index(action)

    records, success = record_episode(
        env,
        choose,
        level=level,
        seed=seed,
        episode=episode,
        nbr_obs=nbr_obs,
        prompt_format=prompt_format,
        tokenizer=tokenizer,
    )
    error = errors[0] if errors else None
    return BotEpisode(records=records, success=success, error=error)


def collect_bot_demos(
    config: DemosConfig,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    on_episode: Callable[[BotEpisode, int], None] | None = None,
) -> tuple[list[DemoRecord], dict[str, Any]]:
    """Play bot episodes `config.seed + i` (i = 0, 1, ...) until enough are collected.

    Args:
        config: level, number of episodes or pairs, seed, prompt settings.
        tokenizer: the tokenizer whose chat template renders `chat` prompts.
        on_episode: called after each episode with it and the number of records kept so far.

    Returns:
        The records (episodes the bot failed are dropped unless `config.keep_failed`) and
        collection statistics.

    Raises:
        BotUnsupportedError: the level is one the bot cannot play, or the bot solves fewer than
            `config.min_bot_success` of its episodes.
        ValueError: unknown level id, action space or language.
    """
    if config.level in BOT_UNSUPPORTED_LEVELS:  # a config built without its checks
        raise BotUnsupportedError(f"BabyAI's bot cannot solve {config.level}; pick another level")
    env = babyai_text.make(config.level, action_space=config.action_space, language=config.language)
    records: list[DemoRecord] = []
    attempts = successes = 0
    first_error: str | None = None
    while True:
        if config.pairs is None and attempts >= config.episodes:
            break
        if config.pairs is not None and len(records) >= config.pairs:
            break
        result = play_bot_episode(
            env,
            level=config.level,
            seed=config.seed + attempts,
            episode=attempts,
            nbr_obs=config.nbr_obs,
            prompt_format=config.prompt_format,
            tokenizer=tokenizer,
        )
        attempts += 1
        successes += result.success
        first_error = first_error or result.error
        if result.success or config.keep_failed:
            records.extend(result.records)
        if on_episode is not None:
            on_episode(result, len(records))
        # Judge the bot once a few episodes are in, so an unsolvable level fails fast.
        if attempts >= min(10, config.episodes) and successes < config.min_bot_success * attempts:
            raise BotUnsupportedError(
                f"BabyAI's bot solved {successes} of {attempts} episodes of {config.level}, below "
                f"demos.min_bot_success={config.min_bot_success}"
                + (f"; first failure: {first_error}" if first_error else "")
            )
    if config.pairs is not None:
        records = records[: config.pairs]
    stats = {
        "episodes_played": attempts,
        "episodes_solved": successes,
        "episodes_kept": len({record.episode for record in records}),
        "pairs": len(records),
    }
    return records, stats


def save_bot_demos(config: DemosConfig, *, progress: bool = True) -> tuple[Dataset, dict[str, Any]]:
    """Collect bot demonstrations as `config` says and save them to `config.output_dir`.

    The folder is checked first (`glam.outputs.check_output_dir`: an earlier dataset there is an
    error unless `config.overwrite`, anything else always is) and written atomically at the end;
    a failure in between writes nothing.

    Returns:
        The saved dataset and the collection statistics.
    """
    # The folder first: a file or a run folder there stops the script before the model loads.
    writer = DemoWriter(
        config.output_dir, metadata={**asdict(config), "source": "bot"}, overwrite=config.overwrite
    )
    tokenizer = None
    if config.prompt_format == "chat":
        _, tokenizer = load_model(config.chat_model)
    unit = "pairs" if config.pairs is not None else "episodes"
    with Progress(
        TextColumn("[bold]bot demos[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not progress,
    ) as bar:
        task = bar.add_task(f"{config.level} ({unit})", total=config.pairs or config.episodes)

        def advance(episode: BotEpisode, kept: int) -> None:
            if config.pairs is None:
                bar.update(task, advance=1)
            else:
                bar.update(task, completed=min(kept, config.pairs))

        records, stats = collect_bot_demos(config, tokenizer=tokenizer, on_episode=advance)
    writer.metadata["stats"] = stats
    writer.extend(records)
    return writer.save(), stats
