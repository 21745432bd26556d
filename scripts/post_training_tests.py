"""Post-training tests: seeded episodes of each test suite, success with 95% CIs, tables, a plot.

    # one CPU: the baselines (fast), then the embedded model zero-shot (slow: fewer episodes)
    python scripts/post_training_tests.py agent.kind=bot eval.suites=[no_change] eval.episodes=1000
    python scripts/post_training_tests.py agent.kind=random eval.suites=[no_change]
    python scripts/post_training_tests.py agent.kind=zero_shot eval.suites=[no_change] \
        eval.episodes=50 eval.num_envs=10

    # a symbolic policy (BabyAI's actor-critic on the grid): the suites that change the env
    python scripts/post_training_tests.py agent.kind=checkpoint agent.path=runs/symbolic/seed-1 \
        'eval.suites=[no_change,new_composition]' eval.level=BabyAI-MixedTestLocal-v0

    # one GPU: a trained run (its newest checkpoint), every suite, on the held-out pairs
    python scripts/post_training_tests.py agent.kind=checkpoint agent.path=runs/glam_paper/seed-1 \
        eval.level=BabyAI-MixedTestLocal-v0 eval.output_dir=runs/glam_paper/seed-1/eval/test

    # several GPUs: one evaluation per GPU (seeds, runs or levels), then aggregate them
    CUDA_VISIBLE_DEVICES=1 python scripts/post_training_tests.py agent.kind=bc \
        agent.path=runs/bc/gotolocal eval.seed=1 eval.output_dir=runs/bc/gotolocal/eval/seed-1
    python scripts/test_results.py 'inputs=[runs/glam_paper]'

Writes results.json (per suite: the level, action space, prompt format and language it played,
success_rate, ci_low, ci_high, mean_return, mean_length, episodes, and the same per task type,
plus the agent and eval settings), results.csv, results.md, results.png and episodes.jsonl to
`eval.output_dir`. A suite that cannot apply to the agent (its actions cannot complete the
suite's level, the suite has no word for one of them, the level never teaches what the suite
composes, the agent reads the grid and the suite changes only words) plays nothing: its row says
"not applicable" and why, and no chart or mean counts it. A folder that already holds results is
refused unless `eval.overwrite=true`; one that is a file, cannot be written or holds another
kind of output (a training run, a dataset) is refused always, before anything loads. Each
finished episode is kept on disk as it ends: an evaluation stopped before its end continues with
`eval.resume=true` (docs/evaluation.md). Options:
configs/eval/post_training_tests.yaml and glam/eval/config.py. Exit status: 0 done, 1 bad config (a key outside the schema or an invalid
value), 2 the evaluation cannot start (missing or damaged checkpoint, unknown suite or level,
an `eval.output_dir` it may not write, a model endpoint that cannot be reached), 130 stopped by
Ctrl-C (the finished episodes kept for `eval.resume=true`).
"""

from __future__ import annotations

import sys

from glam.cli import exit_on, report
from glam.config import config_main, register_configs
from glam.eval.config import PostTrainingTestsConfig

register_configs()


def run(config: PostTrainingTestsConfig) -> None:
    """Evaluate, print the table and where the results went; exit 2 on a user error."""
    from glam.eval.harness import evaluate
    from glam.llm.chat import ChatClientError
    from glam.models.loading import ModelNotFoundError

    # ValueError: an unknown suite or level, an output folder it may not write (OutputDirError).
    try:
        with exit_on(ValueError, FileNotFoundError, ModelNotFoundError, ChatClientError):
            results, paths = evaluate(config)
    except KeyboardInterrupt:  # Ctrl-C: the finished episodes are in the folder already
        sys.exit(
            report(
                f"interrupted: the episodes finished so far are kept in "
                f"{config.eval.output_dir}; continue with eval.resume=true and the same "
                "eval.output_dir",
                status=130,
            )
        )
    table, _, per_task = paths["md"].read_text().partition("## Per task type")
    # The per-task table of every suite is long: on screen only when there is one suite.
    print(table + (f"## Per task type{per_task}" if len(results["suites"]) == 1 else ""))
    for kind, path in paths.items():
        print(f"wrote {kind:8s} {path}")


@config_main(
    PostTrainingTestsConfig, config_path="../configs/eval", config_name="post_training_tests"
)
def main(config: PostTrainingTestsConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
