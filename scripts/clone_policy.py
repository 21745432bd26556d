"""Behavioural cloning of the policy PPO trains: the bot's action's cross-entropy under the
softmax of the candidates' scores (or of the action heads), at the policy's temperature.

    # the default preset's policy (LoRA on SmolLM2's top 4 layers, scoring at temperature 5)
    python scripts/clone_policy.py clone.dataset=runs/demos/gotoredball-nav-obs1 \
        clone.output_dir=runs/clone/gotoredball
    # AFlan's policy: a head on the prompt's last token
    python scripts/clone_policy.py policy.head=action_heads clone.dataset=... clone.output_dir=...
    # BabyAI's symbolic network, on the grid of the same decisions (each episode replayed)
    python scripts/clone_policy.py policy.kind=symbolic symbolic.image_dim=32 \
        symbolic.instr_dim=32 clone.dataset=... clone.output_dir=...
    # evaluate it, or start PPO from its adapter
    python scripts/post_training_tests.py agent.kind=checkpoint agent.path=runs/clone/x/policy ...
    python scripts/train_language_agent.py model.lora.init=runs/clone/x/policy/adapter ...
    python scripts/train_baseline.py --config-name symbolic_ppo train.init_policy=runs/clone/x/policy

`scripts/clm_behavioral_cloning.py` trains the action's tokens as text with TRL; this trains the
policy's output over the actions (glam/bc/choice.py), from the frozen trunk's states computed once
when LoRA adapts the top layers only. Held-out loss, accuracy and the demonstrated action's
probability are measured before training and after each epoch, on the held-out episodes the SFT
script holds out with the same seed. The output folder holds clone.csv (one row per epoch),
config.yaml, the policy folder `policy/` and, last, clone.json; a folder that already holds a
cloned policy is refused unless `clone.overwrite=true`. Each epoch also writes `checkpoint/`: a
killed clone continues from its last finished epoch with `clone.resume=true`. Settings: configs/bc/clone.yaml, schema
glam/bc/config.py. Exit status: 0 done, 1 bad config, 2 the run cannot start (bad dataset, model
not found, a `clone.output_dir` it may not write).
"""

from __future__ import annotations

import json

from glam.bc.config import CloneRunConfig
from glam.cli import exit_on
from glam.config import config_main, register_configs
from glam.demos import load_demos

register_configs()


@config_main(CloneRunConfig, config_path="../configs/bc", config_name="clone")
def main(config: CloneRunConfig) -> None:
    with exit_on(ValueError):
        config.clone.check_output_dir()
        load_demos(config.clone.dataset)

    from glam.bc.choice import clone_policy
    from glam.models.loading import ModelNotFoundError

    with exit_on(ValueError, ModelNotFoundError):
        result = clone_policy(config)
    print(json.dumps(result.summary["final"], indent=2))
    print(f"[glam] cloned policy saved to {result.output_dir / 'policy'} (figures: clone.csv)")


if __name__ == "__main__":
    main()
