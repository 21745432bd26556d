"""Behavioural cloning: fine-tune the LLM on (prompt, action) demonstrations with TRL's SFTTrainer.

    # one CPU or one GPU (LoRA on the embedded SmolLM2-135M by default)
    python scripts/clm_behavioral_cloning.py bc.dataset=runs/demos/gotolocal bc.output_dir=runs/bc/x
    # full fine-tune, with greedy success of zero-shot vs BC on 30 seeded episodes
    python scripts/clm_behavioral_cloning.py model.lora.enabled=false bc.success_episodes=30
    # several GPUs
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml \
        scripts/clm_behavioral_cloning.py bc.dataset=runs/demos/gotolocal

The loss covers the action tokens only; held-out action accuracy (the policy scorer's argmax
over the action space, on held-out episodes) is measured before and after training. The output
folder holds the adapter (or full model), the tokenizer, `bc_policy.json` and `metrics.json`;
load it with `glam.bc.load_bc_policy(folder)`, or evaluate it as the harness's `bc` agent. A
folder that already holds a BC policy is refused unless `bc.overwrite=true`; one that is a file,
cannot be written, holds anything else (a training run, a dataset) or is not empty, always.
Settings: configs/bc/train.yaml, schema glam/bc/config.py. Exit status: 0 done, 1 bad config (a
key outside the schema or an invalid value), 2 the run cannot start (bad dataset, model not
found, a `bc.output_dir` it may not write).
"""

from __future__ import annotations

import json

from glam.bc.config import BCRunConfig
from glam.cli import exit_on
from glam.config import config_main, register_configs
from glam.demos import load_demos

register_configs()


@config_main(BCRunConfig, config_path="../configs/bc", config_name="train")
def main(config: BCRunConfig) -> None:
    # A folder it may not write and a bad dataset fail here, before TRL is even imported
    # (OutputDirError and DemoDatasetError are ValueErrors).
    with exit_on(ValueError):
        config.bc.check_output_dir()
        load_demos(config.bc.dataset)

    from glam.bc.sft import train_bc
    from glam.models.loading import ModelNotFoundError

    with exit_on(ValueError, ModelNotFoundError):
        result = train_bc(config)  # checks bc.output_dir again, before loading the model
    print(json.dumps(result.metrics, indent=2))
    print(f"[glam] BC policy saved to {result.output_dir}")


if __name__ == "__main__":
    main()
