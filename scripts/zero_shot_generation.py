"""BALROG-comparable zero-shot evaluation: the model writes its action as free text.

    # one CPU: the embedded model (SmolLM2-135M-Instruct), BALROG's 5 task types x 10 episodes
    python scripts/zero_shot_generation.py eval.num_envs=10

    # one GPU: any model spec, 100 episodes of each task type
    python scripts/zero_shot_generation.py agent.model=/models/Llama-3.2-1B-Instruct \
        agent.dtype=bfloat16 eval.episodes_per_task_type=100 eval.num_envs=50

    # several GPUs: one model or seed per GPU, then aggregate
    CUDA_VISIBLE_DEVICES=1 python scripts/zero_shot_generation.py eval.seed=1 \
        eval.output_dir=runs/eval/balrog/seed-1
    python scripts/test_results.py 'inputs=[runs/eval/balrog]'

The instruction prompt (goal, actions and what they do, tips) and the last 16 observations and
actions are chat turns in the model's chat template; the answer is decoded greedily (a few
tokens), and one that is not an action becomes "go forward". Success is reported per task type
and overall, in the same files as scripts/post_training_tests.py (results.json, .csv, .md, .png),
plus the invalid-answer rate; a folder that already holds results is refused unless
`eval.overwrite=true`. Options: configs/eval/balrog.yaml and glam/eval/config.py. Exit status
as scripts/post_training_tests.py's: 0 done, 1 bad config, 2 the evaluation cannot start.
"""

from __future__ import annotations

from glam.config import config_main, register_configs
from glam.eval.config import PostTrainingTestsConfig

register_configs()


@config_main(PostTrainingTestsConfig, config_path="../configs/eval", config_name="balrog")
def main(config: PostTrainingTestsConfig) -> None:
    from post_training_tests import run

    run(config)


if __name__ == "__main__":
    main()
