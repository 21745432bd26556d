"""One PPO update on fixed transitions, run by tests/test_distributed.py under each launcher.

    python tests/distributed_probe.py update RUN_DIR OUT.json 1
    accelerate launch --config_file configs/accelerate/zero2.yaml --num_processes 2 \
        tests/distributed_probe.py update RUN_DIR OUT.json 2
    ... tests/distributed_probe.py resume RUN_DIR OUT.json 2

`update` builds the training of the `tiny` preset through the trainer's own `build_training`,
records a checksum of every process's trainable weights as they are before `accelerator.prepare`
(so before any broadcast), runs `ppo_update` on a fixed global batch of 32 transitions split
between the processes (rank r holds rows r*32/N.. with advantages of another scale on each rank,
so only a global normalisation gives the one-process result), then writes a real checkpoint.
`update` also loads the model as `load_model` does under the launcher (partitioned at load under
ZeRO-3) and NPAE's random model with its pretrained embeddings (`load_checks`).
`resume` builds the same training with `train.resume=true` and records the restored Adam moments.
The main process writes what it saw to OUT.json. Each run asserts its own world size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from glam.envs import EnvRunner
from glam.ppo.buffer import Transitions
from glam.ppo.entry import exit_training
from glam.ppo.launch import build_accelerator
from glam.ppo.setup import build_training
from glam.ppo.update import _global_mean_std, ppo_update
from glam.run_config import compose_run

GLOBAL_BATCH = 32
OVERRIDES = [
    "ppo.epochs=2",
    f"ppo.minibatch_size={GLOBAL_BATCH}",  # one step per epoch: the order cannot matter
    "ppo.micro_batch_size=8",
    "ppo.recompute_logprobs=true",
    "ppo.lr=1e-2",
    "train.total_frames=128",
]


def fixed_batch() -> Transitions:
    """The same 32 transitions on every process: real prompts, drawn actions and targets."""
    cfg = compose_run("tiny", OVERRIDES)
    runner = EnvRunner(cfg.env, cfg.policy, num_envs=GLOBAL_BATCH, seed=12345)
    runner.reset()
    generator = torch.Generator().manual_seed(0)
    n = GLOBAL_BATCH
    advantages = torch.randn(n, generator=generator)
    advantages[n // 2 :] = 3.0 * advantages[n // 2 :] + 1.0  # rank 1's share: other statistics
    return Transitions(
        observations=runner.observations(),
        actions=torch.randint(0, len(runner.action_words), (n,), generator=generator),
        logprobs=torch.zeros(n),  # recomputed by the update
        values=torch.zeros(n),
        advantages=advantages,
        returns=torch.randn(n, generator=generator),
    )


def adam_moments(optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """`[sum |exp_avg|, sum exp_avg_sq]` of this process's part of the optimizer state."""
    inner = optimizer
    while hasattr(inner, "optimizer"):  # accelerate's wrapper, then DeepSpeed's ZeRO optimizer
        inner = inner.optimizer
    sums = torch.zeros(2, dtype=torch.float64)
    for state in inner.state.values():
        if "exp_avg" in state:
            sums[0] += state["exp_avg"].double().abs().sum()
            sums[1] += state["exp_avg_sq"].double().sum()
    return sums


def load_checks() -> tuple[bool, bool]:
    """Whether `load_model` hands back every weight partitioned (under ZeRO-3: no process holds
    the whole model, the point of ZeRO-3 at 7B), and whether NPAE's model (`pretrained=False`:
    random weights, the pretrained input embeddings) has those embeddings (collective)."""
    from glam.models.loading import _gathered, load_model

    pretrained, _ = load_model("tiny-random-llama")
    random_init, _ = load_model("tiny-random-llama", pretrained=False)
    partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in pretrained.parameters())
    kept = pretrained.get_input_embeddings().weight
    drawn = random_init.get_input_embeddings().weight
    with _gathered(kept), _gathered(drawn):
        same = kept.numel() > 0 and torch.equal(kept, drawn)
    return partitioned, same


def main(mode: str, run_dir: Path, out: Path, expected_world: int) -> None:
    accelerator = build_accelerator()
    world, rank = accelerator.num_processes, accelerator.process_index
    assert world == expected_world, f"launched {expected_world} processes, the run sees {world}"
    cfg = compose_run("tiny", [*OVERRIDES, f"train.resume={mode == 'resume'}"])
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
    accelerator.wait_for_everyone()

    before_prepare: list[float] = []
    prepare = accelerator.prepare

    def recording_prepare(model, *rest):
        trainable = [p for p in model.parameters() if p.requires_grad]
        before_prepare.append(float(sum(p.double().square().sum() for p in trainable)))
        return prepare(model, *rest)

    accelerator.prepare = recording_prepare
    training = build_training(cfg, accelerator, run_dir)
    accelerator.prepare = prepare
    report: dict[str, object] = {"world_size": world, "mode": mode}
    report["distributed_type"] = accelerator.distributed_type.value
    checksums = accelerator.gather(torch.tensor(before_prepare, device=accelerator.device))
    report["initial_weight_checksums"] = checksums.tolist()

    moments_are_sharded = accelerator.distributed_type.value == "DEEPSPEED"
    if mode == "update":
        batch = fixed_batch()
        share = GLOBAL_BATCH // world
        local = batch.select(torch.arange(rank * share, (rank + 1) * share))
        mean, std = _global_mean_std(accelerator, local.advantages)
        report["advantage_mean_std"] = [float(mean), float(std)]
        report["full_batch_mean_std"] = [
            float(batch.advantages.mean()),
            float(batch.advantages.std()),
        ]
        report["metrics"] = ppo_update(
            training.model, training.optimizer, local, cfg.ppo, accelerator, recompute=True
        )
        training.state.update = 1
        report["checkpoint"] = str(training.save())
        report["base_partitioned_at_load"], report["random_model_keeps_embeddings"] = load_checks()
    moments = adam_moments(training.optimizer).to(accelerator.device)
    moments = accelerator.reduce(moments, "sum" if moments_are_sharded else "mean")
    report["adam_moments"] = moments.tolist()
    training.close()
    if accelerator.is_main_process:
        out.write_text(json.dumps(report, indent=1))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
    # As the training scripts end (the report is written): a rank that exited through the
    # interpreter's finalization could abort there, DeepSpeed keeping gloo's threads alive.
    exit_training(0)
