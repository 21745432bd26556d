"""BALROG's BabyAI protocol as BALROG runs it: the model writes its action in a dialogue.

    # one CPU: the embedded model (SmolLM2-135M-Instruct) in this process, BALROG's settings
    python scripts/zero_shot_generation.py
    # ... or BALROG's chain-of-thought agent, or a served model (any OpenAI-compatible server)
    python scripts/zero_shot_generation.py eval.generation.agent_type=cot
    python scripts/serve_openai.py port=8080 &
    python scripts/zero_shot_generation.py eval.client.backend=openai

    # one GPU: any model spec in-process, 100 episodes of each task type
    python scripts/zero_shot_generation.py agent.model=/models/Llama-3.2-1B-Instruct \
        agent.dtype=bfloat16 eval.episodes_per_task_type=100 eval.num_envs=50
    # ... or behind vLLM on that GPU
    vllm serve meta-llama/Llama-3.2-1B-Instruct --port 8080 &
    python scripts/zero_shot_generation.py eval.client.backend=openai eval.num_envs=50

    # several GPUs: one model or seed per GPU, then aggregate
    CUDA_VISIBLE_DEVICES=1 python scripts/zero_shot_generation.py eval.seed=1 \
        eval.output_dir=runs/eval/balrog/seed-1
    python scripts/test_results.py 'inputs=[runs/eval/balrog]'

BALROG's instruction, dialogue (16 observations and actions), agent types (`naive`, `cot`),
answer matching, invalid-answer replacement ("go forward") and feedback, temperature 1, 4096
tokens, no distractor in the room, 10 episodes of each of MixedTrainLocal's five task types:
configs/eval/balrog.yaml, its settings side by side with BALROG's file in docs/evaluation.md.
The model answers in this process (`eval.client.backend=local`) or from any OpenAI-compatible
server (`openai`, `eval.client.base_url`). Results as scripts/post_training_tests.py writes
them (results.json, .csv, .md, .png, episodes.jsonl), with BALROG's form beside ours: progression
per task type with its standard error, and success with its 95% Wilson interval. A folder that
already holds results is refused unless `eval.overwrite=true`; a run stopped before its end (a
kill, a pre-emption: hours on a CPU) keeps its finished episodes and continues with
`eval.resume=true` and the same `eval.output_dir` (docs/evaluation.md). Exit status: 0 done, 1 bad
config, 2 the evaluation cannot start or its model endpoint fails (unreachable, refusing).
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
