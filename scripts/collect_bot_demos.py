"""Collect BabyAI's bot demonstrations as a Hugging Face dataset of (prompt, action) pairs.

    python scripts/collect_bot_demos.py                                  # 100 GoToLocal episodes
    python scripts/collect_bot_demos.py demos.pairs=400 demos.output_dir=runs/demos/gotolocal-400
    python scripts/collect_bot_demos.py demos.level=BabyAI-MixedTrainLocal-v0 demos.episodes=1000

The bot plans on the grid: one CPU process, no GPU, no model (except the tokenizer of
`demos.chat_model` for `demos.prompt_format=chat`). Settings: configs/demos/collect.yaml, schema
glam/bc/config.py. Load the result with `datasets.load_from_disk(demos.output_dir)` or
`glam.bc.load_demos`; train on it with scripts/clm_behavioral_cloning.py. An existing
`demos.output_dir` holding a dataset is refused unless `demos.overwrite=true`; one that is a
file, cannot be written, holds anything else (a training run...) or is not empty is refused
always, before any episode. Exit status: 0 done, 1 bad config (a key outside the schema or an
invalid value), 2 the collection cannot run (unknown level or action space, an output folder it
may not write, a bot that fails too often).
"""

from __future__ import annotations

from glam.bc.config import CollectDemosConfig
from glam.cli import exit_on
from glam.config import config_main, register_configs

register_configs()


@config_main(CollectDemosConfig, config_path="../configs/demos", config_name="collect")
def main(config: CollectDemosConfig) -> None:
    from glam.bc.bot import save_bot_demos

    # ValueError: unknown level, action space or language, an output folder that cannot take the
    # dataset (glam.outputs.OutputDirError); BotUnsupportedError is one too.
    with exit_on(ValueError):
        dataset, stats = save_bot_demos(config.demos, progress=config.progress)
    demos = config.demos
    print(
        f"[glam] wrote {len(dataset)} pairs from {stats['episodes_kept']} episodes of {demos.level} "
        f"(bot solved {stats['episodes_solved']}/{stats['episodes_played']}) to {demos.output_dir}"
    )


if __name__ == "__main__":
    main()
