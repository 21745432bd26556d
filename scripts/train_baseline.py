"""Train one of the agents GLAM is compared with, in the same envs and run folders as GLAM.

    # one CPU process: DRRN (He et al. 2016) on GoToRedBallNoDists
    python scripts/train_baseline.py --config-name drrn train.output_dir=runs/drrn
    # BabyAI's symbolic actor-critic, trained by PPO on the grid
    python scripts/train_baseline.py --config-name symbolic_ppo train.output_dir=runs/symbolic
    # LLM4RL: a mediator learns when to ask the LLM planner for a subgoal (glam.ask)
    python scripts/train_baseline.py --config-name ask_symbolic train.output_dir=runs/ask
    # RL-GPT: coded actions chosen by the LLM join the actions (glam.codeact)
    python scripts/train_baseline.py --config-name codeact_symbolic train.output_dir=runs/codeact
    # one GPU
    accelerate launch --num_processes 1 scripts/train_baseline.py --config-name drrn \
        train.output_dir=runs/drrn_gpu
    # N processes (DDP; N CPU processes over gloo here, GPUs with multi_gpu.yaml)
    accelerate launch --config_file configs/accelerate/multi_cpu.yaml --num_processes 2 \
        scripts/train_baseline.py --config-name drrn train.output_dir=runs/drrn_2p
    # continue a run from its newest checkpoint
    python scripts/train_baseline.py --config-name drrn train.output_dir=runs/drrn \
        train.resume=true

The agent is `policy.kind`: `drrn` (its own TD learner, `glam.baselines.drrn_trainer`, section
`drrn`) or `symbolic` (the PPO trainer, section `symbolic`); language models (`llm`) train with
scripts/train_language_agent.py. The `env.*` and `train.*` keys are those of
train_language_agent.py, and so are the run folder, the checkpoints, resuming, and stop signals:
SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) writes a checkpoint and exits with status 0; a second
Ctrl-C stops at once. Exit status: 0 done (or checkpointed on a signal), 1 bad config (Hydra),
2 the run cannot start (`policy.kind=llm` among the reasons) or a checkpoint cannot be written,
3 the loss became NaN, 4 a coupling's outside part failed (e.g. ONI's annotator), 130 a second
Ctrl-C.
"""

from __future__ import annotations

from glam.cli import report
from glam.config import config_main, register_configs
from glam.run_config import TrainingRunConfig

register_configs()


@config_main(TrainingRunConfig, config_path="../configs", config_name="drrn")
def main(cfg: TrainingRunConfig) -> None:
    """Train with the validated config (exit 1 before this on a bad one); report how it ended."""
    from glam.ppo.entry import exit_training, hydra_config_name

    exit_training(run(cfg, config_name=hydra_config_name()))


def run(cfg: TrainingRunConfig, *, config_name: str = "run") -> int:
    """Train the baseline `cfg` names in this process (one of `accelerate launch`'s); return
    the exit status."""
    if cfg.policy.kind == "llm":
        return report(
            "policy.kind=llm trains a language model: use scripts/train_language_agent.py "
            "(this script trains policy.kind=drrn or symbolic)"
        )
    from functools import partial

    from glam.ppo.entry import run_training

    if cfg.policy.kind == "drrn":
        from glam.baselines.drrn_trainer import train_drrn as trainer
    else:
        from glam.baselines.symbolic import build_symbolic_policy
        from glam.couplings import coupling_hooks, coupling_policy_factory
        from glam.ppo.trainer import train

        hooks = coupling_hooks(cfg)
        make_policy = coupling_policy_factory(cfg, build_symbolic_policy, hooks)
        trainer = partial(train, make_policy=make_policy, hooks=hooks)
        if cfg.algorithm.name == "sac":
            from glam.offpolicy.trainer import train_sac

            if hooks:
                return report("algorithm.name=sac trains without couplings (ask, oni, codeact)")
            trainer = partial(train_sac, make_policy=build_symbolic_policy)
    return run_training(cfg, trainer, config_name=config_name)


if __name__ == "__main__":
    main()
