"""The update: `ppo.epochs` passes of minibatch gradient steps over a rollout.

Each micro-batch's loss is the algorithm's (`glam.ppo.algorithms`: PPO's clipped loss, GRPO's,
GiGPO's) plus the hooks' terms; micro-batches accumulate into one optimizer step per minibatch,
gradients averaged over processes by the `Accelerator`. Under reduced precision the old
log-probabilities are recomputed first (`_recompute_old_logprobs`), so the first ratio is
exactly 1. A policy with memory is updated in whole sequences of `ppo.recurrence` steps
(`policy_output`; the loop's docstring in `glam.ppo.trainer` says how).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from glam.config import PPOConfig
from glam.policy.observations import policy_inputs
from glam.policy.output import PolicyOutput
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.ppo.algorithms import PPO, Algorithm
from glam.ppo.buffer import Transitions, sequence_positions
from glam.ppo.diagnostics import gradient_split
from glam.ppo.hooks import TrainerHook
from glam.ppo.learner import raise_if_diverged
from glam.ppo.losses import clipped_value_loss, normalize_advantages
from glam.ppo.timing import PhaseClock

__all__ = [
    "accumulation_steps",
    "finite_output",
    "micro_batch_size",
    "policy_output",
    "ppo_update",
]


def ppo_update(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Transitions,
    ppo: PPOConfig,
    accelerator: Accelerator,
    recompute: bool,
    hooks: Sequence[TrainerHook] = (),
    clock: PhaseClock | None = None,
    *,
    algorithm: Algorithm | None = None,
    value_only: bool = False,
) -> dict[str, float]:
    """Run `ppo.epochs` epochs of minibatch gradient steps on `batch` (this process's part).

    Each micro-batch's loss is the algorithm's (`glam.ppo.algorithms`; by default PPO's) plus
    the terms `hooks` add (`TrainerHook.loss`); with `value_only` (the critic's warm-up,
    `ppo.value_warmup_updates`) it is `ppo.value_coef` times PPO's value loss alone, and the
    stats are still the algorithm's. `clock` is charged the forwards, backwards and
    optimizer steps.

    Each process takes `minibatch_size / world_size` transitions per step, in chunks of
    `micro_batch_size` with gradient accumulation; gradients are averaged over processes. With
    memory (`batch.memories`, env-major) the minibatches and chunks are whole sequences of
    `ppo.recurrence` steps (the module docstring).

    Returns metrics averaged over minibatches and processes, plus `debug/first_ratio_deviation`:
    `max |ratio - 1|` on the first minibatch, before any step (0 unless log-probs drift between
    the rollout's forward and the update's).

    Raises:
        TrainingDiverged: on a non-finite loss or gradient norm (on every process at once).
    """
    clock = clock or PhaseClock()
    algorithm = algorithm or PPO(AlgorithmConfig(), ppo)
    device = accelerator.device
    local_minibatch = ppo.minibatch_size // accelerator.num_processes
    micro = micro_batch_size(ppo, accelerator.num_processes)
    # One optimizer step per minibatch, whoever built the accelerator (DeepSpeed's engine was
    # given the same number by `_configure_deepspeed`).
    accelerator.gradient_accumulation_steps = local_minibatch // micro
    model.train()
    if ppo.normalize_advantages and algorithm.normalizes_advantages:
        mean, std = _global_mean_std(accelerator, batch.advantages)
        batch.advantages = normalize_advantages(batch.advantages, mean, std)
    # Without memory a "sequence" is one transition, and this is plain PPO's shuffle.
    recurrence = 1 if batch.memories is None else ppo.recurrence
    if len(batch) % recurrence:
        raise ValueError(
            f"{len(batch)} transitions are not whole sequences of ppo.recurrence={recurrence} steps"
        )
    orders = [torch.randperm(len(batch) // recurrence) for _ in range(ppo.epochs)]
    sequences, micro_sequences = local_minibatch // recurrence, micro // recurrence
    if recompute:
        with clock.phase("recompute"):
            _recompute_old_logprobs(model, batch, orders[0], sequences, micro_sequences, recurrence)
    trainable = [p for p in model.parameters() if p.requires_grad]
    split = {}
    if algorithm.name == "ppo" and accelerator.distributed_type != DistributedType.DEEPSPEED:
        first = orders[0].split(sequences)[0].split(micro_sequences)[0]
        with clock.phase("diagnostics"):
            split = _gradient_split(
                accelerator,
                model,
                batch.select(sequence_positions(first, recurrence)),
                ppo,
                algorithm,
            )

    sums: dict[str, float] = defaultdict(float)
    # The algorithm's stats stay on the device, in float64 (the sums Python's floats gave), and
    # are read once after the epochs: a read per micro-batch would make the host wait for the
    # GPU before it could prepare the next micro-batch.
    stat_sums: dict[str, torch.Tensor] = {}
    count, steps, first_deviation, epochs_run = 0, 0, None, 0
    for epoch in range(ppo.epochs):
        epoch_kl: list[torch.Tensor] = []
        for minibatch in orders[epoch].split(sequences):
            for chunk in minibatch.split(micro_sequences):
                mb = batch.select(sequence_positions(chunk, recurrence))
                with accelerator.accumulate(model):
                    with clock.phase("forward"):
                        loss, stats = _chunk_loss(
                            model, mb, ppo, device, hooks, recurrence, algorithm, value_only
                        )
                        raise_if_diverged(accelerator, not torch.isfinite(loss).item())
                    with clock.phase("backward"):
                        accelerator.backward(loss)
                    with clock.phase("optimizer"):
                        if accelerator.sync_gradients:
                            grad_norm = accelerator.clip_grad_norm_(trainable, ppo.max_grad_norm)
                            if grad_norm is not None:  # DeepSpeed clips internally, may not say
                                norm = float(grad_norm)
                                raise_if_diverged(accelerator, not math.isfinite(norm))
                                sums["losses/grad_norm"] += norm
                                steps += 1
                        optimizer.step()  # a no-op until the last chunk of the minibatch
                        optimizer.zero_grad()
                if first_deviation is None:
                    first_deviation = stats["ratio_max_deviation"].detach()
                for key, value in stats.items():
                    if key != "ratio_max_deviation":
                        term = value.detach().double().reshape(()) * len(mb)
                        total = stat_sums.get(key)
                        stat_sums[key] = term if total is None else total + term
                count += len(mb)
                if ppo.target_kl is not None:
                    epoch_kl.append(stats["approx_kl"].detach())
        epochs_run += 1
        if ppo.target_kl is not None:
            kl = torch.stack(epoch_kl).to(device, torch.get_default_dtype()).mean()
            if accelerator.reduce(kl, "mean").item() > ppo.target_kl:
                break
    # A step can leave infinite weights behind a finite gradient: never save or roll out those.
    raise_if_diverged(accelerator, ~_all_finite(trainable))

    totals = torch.stack(list(stat_sums.values())).tolist() if stat_sums else []
    metrics = {f"losses/{key}": total / count for key, total in zip(stat_sums, totals, strict=True)}
    metrics["losses/grad_norm"] = sums["losses/grad_norm"] / steps if steps else math.nan
    reduced = accelerator.reduce(
        torch.tensor(list(metrics.values()), device=device, dtype=torch.float64), "mean"
    )
    metrics = dict(zip(metrics, reduced.tolist(), strict=True))
    deviation = first_deviation.reshape(1).to(device, torch.float64)
    metrics["debug/first_ratio_deviation"] = _reduce_max(accelerator, deviation)
    metrics["charts/epochs"] = float(epochs_run)
    return metrics | split


def _gradient_split(
    accelerator: Accelerator,
    model: torch.nn.Module,
    mb: Transitions,
    ppo: PPOConfig,
    algorithm: PPO,
) -> dict[str, float]:
    """`glam.ppo.diagnostics.gradient_split` on the micro-batch `mb`, through the policy
    module itself (no DDP hook fires), averaged over processes."""
    module = accelerator.unwrap_model(model)
    device = accelerator.device
    recurrence = 1 if mb.memories is None else ppo.recurrence
    with accelerator.autocast():
        output = policy_output(module, mb, recurrence)
    split = gradient_split(
        *algorithm.loss_inputs(output, mb, device),
        ppo,
        [p for p in module.parameters() if p.requires_grad],
    )
    reduced = accelerator.reduce(
        torch.tensor(list(split.values()), device=device, dtype=torch.float64), "mean"
    )
    return dict(zip(split, reduced.tolist(), strict=True))


def _chunk_loss(
    model: torch.nn.Module,
    mb: Transitions,
    ppo: PPOConfig,
    device: torch.device,
    hooks: Sequence[TrainerHook] = (),
    recurrence: int = 1,
    algorithm: Algorithm | None = None,
    value_only: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward a micro-batch and return its loss (the algorithm's, PPO's by default, plus the
    hooks' terms; with `value_only` the weighted value loss alone) and the algorithm's stats (a
    NaN loss if the policy's outputs are not finite: the caller stops every process on it).

    With memory, `mb` holds sequences of `recurrence` steps, step by step (`policy_output`);
    the loss is the mean over all their steps."""
    output = policy_output(model, mb, recurrence)
    if not finite_output(output):
        return torch.tensor(float("nan")), {}
    algorithm = algorithm or PPO(AlgorithmConfig(), ppo)
    loss, stats = algorithm.loss(output, mb, device)
    if value_only:
        values = output.values.float()
        returns, old_values = mb.returns.to(device), mb.values.to(device)
        return ppo.value_coef * clipped_value_loss(
            values, old_values, returns, ppo.value_clip_eps
        ), stats
    for hook in hooks:
        term = hook.loss(output, mb)
        if term is not None:
            loss = loss + term
    return loss, stats


def finite_output(output: PolicyOutput) -> torch.Tensor:
    """Scores of the existing candidates and values are finite (absent ones are -inf): one flag
    on the outputs' device, for the caller to read once (a boolean-mask index and two reads made
    the host wait for a GPU three times)."""
    absent = ~output.mask.to(output.logits.device)
    return (torch.isfinite(output.logits) | absent).all() & torch.isfinite(output.values).all()


def _all_finite(parameters: Sequence[torch.Tensor]) -> torch.Tensor:
    """Whether every value of `parameters` is finite: one flag, read once, instead of a read per
    tensor. Under DeepSpeed ZeRO-3 a parameter is an empty placeholder between forwards: its
    shard (`ds_tensor`) is checked, and `raise_if_diverged` combines the processes' flags."""
    flags = [torch.isfinite(getattr(p, "ds_tensor", p)).all() for p in parameters]
    return torch.stack(flags).all() if flags else torch.tensor(True)


def policy_output(model: torch.nn.Module, mb: Transitions, recurrence: int = 1) -> PolicyOutput:
    """The policy's output on the micro-batch `mb`, row for row.

    A policy with memory reads `mb` as sequences of `recurrence` steps laid out step by step
    (`glam.ppo.buffer.sequence_positions`: the sequences' first steps, then their second...):
    one forward per step, the first from the memories the rollout stored, each next from the
    memories the previous one returned, zeroed where the previous step ended an episode.
    """
    if mb.memories is None:
        return model(**mb.observations.inputs())
    count = len(mb) // recurrence
    memory = mb.memories[:count]
    outputs = []
    for step in range(recurrence):
        rows = range(step * count, (step + 1) * count)
        output = model(**policy_inputs(mb.observations.select(rows), memory))
        outputs.append(output)
        ended = mb.dones[step * count : (step + 1) * count].to(output.memory.device)
        memory = output.memory * ~ended[:, None]
    return PolicyOutput.cat(outputs)


@torch.no_grad()
def _recompute_old_logprobs(
    model: torch.nn.Module,
    batch: Transitions,
    order: torch.Tensor,
    minibatch: int,
    micro: int,
    recurrence: int = 1,
) -> None:
    """Replace the rollout's log-probs and values by those of the update's forward pass
    (`order` of sequences of `recurrence` steps, `minibatch` and `micro` counted in sequences),
    and keep the frozen trunk's states a policy returns on the way (a writing policy's, whose
    trunk depends on the answers: `glam.trunk`), for the epochs to run from.

    Chunks follow the first epoch's, so each first-epoch forward sees exactly the inputs (same
    batch composition and padding) it is compared with: in bf16 the ratio is then exactly 1
    before the first step, where batching differences alone would otherwise move it.
    """
    kept: list[Any] = [None] * len(batch)
    for mb_index in order.split(minibatch):
        for chunk in mb_index.split(micro):
            positions = sequence_positions(chunk, recurrence)
            mb = batch.select(positions)
            output = policy_output(model, mb, recurrence)
            actions = mb.actions.to(output.values.device)
            batch.logprobs[positions] = output.dist.log_prob(actions).float().cpu()
            batch.values[positions] = output.values.float().cpu()
            _recompute_token_logprobs(batch, positions, output)
            for position, states in zip(positions.tolist(), output.trunk or (), strict=False):
                kept[position] = states
    if all(states is not None for states in kept):  # a writing policy's trunk, kept on the way
        batch.observations = batch.observations.with_trunk(kept)


def _recompute_token_logprobs(
    batch: Transitions, positions: torch.Tensor, output: PolicyOutput
) -> None:
    """A writing policy's answers keep each token's old log-probability (GRPO's token-level
    ratio): replace them too."""
    tokens = getattr(output, "token_logprobs", None)
    answers = getattr(batch.observations, "answers", None)
    if tokens is not None and answers is not None:
        answers.logprobs[positions] = tokens.float().cpu()


def micro_batch_size(ppo: PPOConfig, world: int) -> int:
    """Transitions per forward/backward chunk on each process."""
    local = ppo.minibatch_size // world
    return min(ppo.micro_batch_size or local, local)


def accumulation_steps(ppo: PPOConfig, world: int) -> int:
    """Micro-batches accumulated into one optimizer step (one minibatch)."""
    return (ppo.minibatch_size // world) // micro_batch_size(ppo, world)


def _global_mean_std(
    accelerator: Accelerator, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    sums = torch.stack(
        [values.sum(), values.square().sum(), torch.tensor(float(values.numel()))]
    ).to(accelerator.device, torch.float64)
    total, total_sq, n = accelerator.reduce(sums, "sum").cpu().tolist()
    mean = total / n
    variance = max(total_sq / n - mean * mean, 0.0) * n / max(n - 1, 1)
    return torch.tensor(mean), torch.tensor(math.sqrt(variance))


def _reduce_max(accelerator: Accelerator, value: torch.Tensor) -> float:
    return float(accelerator.gather(value.reshape(1)).max().item())
