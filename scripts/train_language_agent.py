"""Fine-tune a language model as a BabyAI-Text agent with online PPO (GLAM).

    # one CPU process (default preset: the embedded SmolLM2-135M + LoRA; `tiny`: a few seconds)
    python scripts/train_language_agent.py train.output_dir=runs/smollm2
    python scripts/train_language_agent.py --config-name tiny train.output_dir=runs/tiny
    # the model writes its action (policy.kind=generate): turn-level PPO, GRPO, GiGPO
    python scripts/train_language_agent.py --config-name written_smollm2 train.output_dir=runs/w
    python scripts/train_language_agent.py --config-name written_smollm2_grpo train.output_dir=runs/g
    # one GPU
    accelerate launch --num_processes 1 scripts/train_language_agent.py \
        --config-name glam_paper env.num_envs=8 train.output_dir=runs/paper_1gpu
    # several GPUs: DDP, or DeepSpeed ZeRO-2 / ZeRO-3 with configs/accelerate/zero{2,3}.yaml
    accelerate launch --config_file configs/accelerate/multi_gpu.yaml --num_processes 8 \
        scripts/train_language_agent.py --config-name glam_paper train.output_dir=runs/paper
    # N CPU processes over gloo (this file really starts N; `--cpu --num_processes N` starts 1)
    accelerate launch --config_file configs/accelerate/multi_cpu.yaml --num_processes 2 \
        scripts/train_language_agent.py --config-name tiny train.output_dir=runs/2p
    # DeepSpeed ZeRO-2 / ZeRO-3 on the CPU (no CUDA: DS_ACCELERATOR=cpu is set for you)
    accelerate launch --config_file configs/accelerate/zero2.yaml --num_processes 2 \
        scripts/train_language_agent.py --config-name tiny train.output_dir=runs/zero2
    # continue a run from its newest checkpoint (starts fresh if it has none), or from an older one
    python scripts/train_language_agent.py --config-name tiny train.output_dir=runs/tiny \
        train.resume=true
    python scripts/train_language_agent.py --config-name tiny train.output_dir=runs/tiny \
        train.resume_from=update_000002

Presets live in configs/ (`glam_paper`, `smollm2_lora_cpu`, `tiny`); any key of
`glam.run_config.TrainingRunConfig` can be overridden, and a misspelt key stops the run at start-up.
SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) writes a checkpoint and exits with status 0; a second Ctrl-C
stops at once. Exit status: 0 done (or checkpointed on a signal), 1 bad config (Hydra), 2 the run
cannot start or a checkpoint cannot be written, 3 the loss became NaN, 4 a coupling's outside
part failed (e.g. ONI's annotator), 130 a second Ctrl-C.
See docs/training.md and the README's "Checkpoints".
"""

from __future__ import annotations

from glam.cli import report
from glam.config import config_main, register_configs
from glam.run_config import TrainingRunConfig

register_configs()


@config_main(TrainingRunConfig, config_path="../configs", config_name="smollm2_lora_cpu")
def main(cfg: TrainingRunConfig) -> None:
    """Train with the validated config (exit 1 before this on a bad one); report how it ended."""
    from glam.ppo.entry import exit_training, hydra_config_name

    exit_training(run(cfg, config_name=hydra_config_name()))


def run(cfg: TrainingRunConfig, *, config_name: str = "run") -> int:
    """Train with `cfg` in this process (one of `accelerate launch`'s); return the exit status."""
    from functools import partial

    from glam.couplings import coupling_hooks, coupling_policy_factory
    from glam.ppo.entry import run_training
    from glam.ppo.setup import build_policy
    from glam.ppo.trainer import train

    hooks = coupling_hooks(cfg)
    make_policy = coupling_policy_factory(cfg, build_policy, hooks)
    if cfg.algorithm.name == "sac":
        from glam.offpolicy.trainer import train_sac

        if hooks:
            return report("algorithm.name=sac trains without couplings (teach, ask, oni, codeact)")
        return run_training(
            cfg, partial(train_sac, make_policy=build_policy), config_name=config_name
        )
    trainer = partial(train, make_policy=make_policy, hooks=hooks)
    return run_training(cfg, trainer, config_name=config_name)


if __name__ == "__main__":
    main()
