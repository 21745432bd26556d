"""Behavioural cloning of the policy's own choice: the cross-entropy of the demonstrated action
under the policy PPO trains.

TRL's SFT (`glam.bc.sft`) trains the action's tokens as text: the likelihood of "go forward"
after the prompt, whatever the other actions' likelihoods. The policy PPO trains is another
function of the same network: the softmax, at `policy.temperature`, of the candidates' scores
(`head=scoring`), or of a head on the prompt's last token (`head=action_heads`). This module fits
that output to the bot's action by cross-entropy, so that a cloned policy is exactly a PPO
policy: `LLMActorCritic.save_pretrained` writes it, the evaluation harness plays it
(`agent.kind=checkpoint`), and PPO starts from its adapter (`model.lora.init=.../policy/adapter`).

With LoRA on the top layers only, the frozen trunk's states of each pair are computed once
(`glam.trunk`) and every epoch runs only the adapted layers, as PPO's update does.

After each epoch the trained weights (the adapter and heads, or the trained layers), the
optimizer, the schedule, the data order's generator and the figures so far are written to
`checkpoint/` (into a temporary sibling, then renamed), so that a killed clone continues from its
last finished epoch (`clone.resume=true`) to the numbers it would have reached uninterrupted; the
folder is removed once the clone is finished.

The same demonstrations clone BabyAI's symbolic network (`policy.kind=symbolic`): each episode is
replayed from its seed with its recorded actions to find the grid the network reads at each
decision (checked against the prompt recorded there), so that the symbolic agent and the
language-model agents learn from the very same decisions, split alike.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm import tqdm
from transformers import get_scheduler

from glam.baselines.symbolic import SymbolicActorCritic
from glam.bc.config import CloneConfig, CloneRunConfig
from glam.bc.sft import dataset_action_space
from glam.config import EnvConfig
from glam.demos import (
    DemoDatasetError,
    demo_metadata,
    load_demos,
    replay_demonstrations,
    split_pairs,
)
from glam.outputs import mark
from glam.policy.files import env_record
from glam.policy.llm_policy import LLMActorCritic
from glam.policy.observations import GridObservations, TextObservations
from glam.threads import set_torch_threads

__all__ = [
    "CloneResult",
    "DecisionSet",
    "clone_policy",
    "measure",
    "replay_grids",
    "split_decisions",
]

WRITER = "clone_policy"
SUMMARY_FILE = "clone.json"
EPOCHS_FILE = "clone.csv"
POLICY_FOLDER = "policy"
CHECKPOINT_FOLDER = "checkpoint"
PROGRESS_FILE = "progress.json"
"""In `checkpoint/`, written last: the epoch finished, the figures so far."""
UNCHECKED_KEYS = ("resume", "overwrite", "progress", "torch_threads")
"""Settings of `clone` a resumed clone may change: they do not change its numbers."""


class CloneResumeError(ValueError):
    """An unfinished clone that cannot be continued with these settings; the message says why."""


@dataclass
class DecisionSet:
    """Demonstrated decisions as the policy reads them: prompts, candidates (the trunk states
    once computed) and the index of the demonstrated action among the candidates."""

    observations: TextObservations | GridObservations
    targets: Tensor
    """`(decisions,)` long."""

    def __len__(self) -> int:
        return len(self.targets)

    @classmethod
    def from_pairs(cls, pairs: Dataset, action_words: tuple[str, ...]) -> DecisionSet:
        prompts = list(pairs["prompt"])
        return cls(
            TextObservations(prompts, [list(action_words)] * len(prompts)),
            _targets(pairs, action_words),
        )

    @classmethod
    def grid_from_pairs(
        cls, pairs: Dataset, action_words: tuple[str, ...], language: str | None = None
    ) -> DecisionSet:
        """The decisions as the symbolic network reads them: the grid at each, found by
        replaying its episode (`replay_grids`)."""
        return cls(replay_grids(pairs, language), _targets(pairs, action_words))

    def batch(self, positions: list[int]) -> tuple[TextObservations | GridObservations, Tensor]:
        return self.observations.select(positions), self.targets[positions]


def _targets(pairs: Dataset, action_words: tuple[str, ...]) -> Tensor:
    return torch.tensor([action_words.index(a) for a in pairs["action"]], dtype=torch.long)


def replay_grids(pairs: Dataset, language: str | None = None) -> GridObservations:
    """minigrid's observation at each of `pairs`' decisions, in their order: each episode reset
    with its seed and stepped with its recorded actions (`action_index`, in step order).

    Raises:
        DemoDatasetError: a column the replay needs is missing, the pairs mix levels or action
            spaces, an episode's steps are not 0, 1, 2..., or the replay does not show what the
            recorded prompt shows (another env, or another version of it).
    """
    needed = {"level", "action_space", "episode", "seed", "step", "action_index", "mission"}
    missing = sorted(needed - set(pairs.column_names))
    if missing:
        raise DemoDatasetError(
            f"the demonstrations have no {missing} column: the grid at each "
            "decision is found by replaying its episode from its seed"
        )
    levels, spaces = set(pairs["level"]), set(pairs["action_space"])
    if len(levels) != 1 or len(spaces) != 1:
        raise DemoDatasetError(
            f"the demonstrations mix levels {sorted(levels)} or action spaces {sorted(spaces)}: "
            "the symbolic network is cloned on one level and action space at a time"
        )
    rows = pairs.select_columns(sorted(needed | {"prompt"})).to_list()
    seen: list[dict | None] = [None] * len(rows)
    for step in replay_demonstrations(rows, levels.pop(), spaces.pop(), language):
        seen[step.index] = step.obs
    return GridObservations.from_minigrid(seen)  # type: ignore[arg-type]  # all filled above


@dataclass
class CloneResult:
    """What a cloning run produced."""

    output_dir: Path
    summary: dict
    """`clone.json`'s content (with the held-out decisions' demonstrated actions and the
    policy's choices before and after training: agents cloned on the same data are compared on
    the same decisions, `glam.eval.stats.mcnemar_exact_p`)."""


def clone_policy(run: CloneRunConfig) -> CloneResult:
    """Clone the demonstrations of `run.clone.dataset` into the policy `run.model`/`run.policy`;
    save it under `run.clone.output_dir`/policy and return the figures.

    Raises:
        glam.outputs.OutputDirError: `clone.output_dir` may not take the result (checked first).
        DemoDatasetError: the dataset is missing, malformed, cannot be split, or was written in
            another prompt format than `policy.prompt_format`.
        CloneResumeError: `clone.resume` with settings other than the unfinished clone's.
    """
    clone = run.clone
    output_dir = clone.check_output_dir()
    checkpoint = output_dir / CHECKPOINT_FOLDER
    if clone.resume and not clone.overwrite:
        if (output_dir / SUMMARY_FILE).is_file():
            print(f"[clone] {output_dir} holds a finished clone: nothing to do", flush=True)
            return CloneResult(output_dir, json.loads((output_dir / SUMMARY_FILE).read_text()))
        if (checkpoint / PROGRESS_FILE).is_file():
            _check_same_clone(output_dir, run)
        else:
            print(f"[clone] clone.resume=true, but {output_dir} has no checkpoint: a fresh start")
    threads = set_torch_threads(clone.torch_threads, "clone.torch_threads")
    print(f"[clone] {threads.describe()}", flush=True)
    pairs = load_demos(clone.dataset, keep_in_memory=True)
    space = dataset_action_space(pairs)
    collected_with = demo_metadata(pairs)
    prompt_format = str(collected_with.get("prompt_format", "glam"))
    if prompt_format != run.policy.prompt_format:
        raise DemoDatasetError(
            f"the demonstrations' prompts are in the {prompt_format!r} format, the policy reads "
            f"policy.prompt_format={run.policy.prompt_format!r}: set it to {prompt_format}"
        )
    train_pairs, eval_pairs = split_decisions(pairs, clone)
    levels = sorted(set(pairs["level"])) if "level" in pairs.column_names else []
    env = EnvConfig(
        name=levels[0] if len(levels) == 1 else EnvConfig.name,
        nbr_obs=int(collected_with.get("nbr_obs", 3)),
        action_space=space.name,
        language=str(collected_with.get("language") or "en"),
    )
    policy: LLMActorCritic | SymbolicActorCritic
    if run.policy.kind == "symbolic":
        train, held_out = (
            DecisionSet.grid_from_pairs(part, space.words, collected_with.get("language"))
            for part in (train_pairs, eval_pairs)
        )
        torch.manual_seed(clone.seed)  # the network's initialisation
        policy = SymbolicActorCritic(run.symbolic, space.words)
        policy.training_env = env_record(env)
    else:
        train = DecisionSet.from_pairs(train_pairs, space.words)
        held_out = DecisionSet.from_pairs(eval_pairs, space.words)
        torch.manual_seed(clone.seed)  # the adapter's and the heads' initialisation
        policy = LLMActorCritic.from_config(run.model, run.policy, space.words, training_env=env)
    if clone.cache_trunk and isinstance(policy, LLMActorCritic):
        problem = policy.trunk_cache_problem()
        if problem is None:
            policy.enable_trunk_cache()
            started = time.perf_counter()
            for decisions in (train, held_out):
                _keep_trunk(policy, decisions, clone.batch_size, clone.progress)
            trunk_seconds = time.perf_counter() - started
            print(
                f"[glam] frozen trunk of {len(train) + len(held_out)} decisions kept in "
                f"{trunk_seconds:.0f} s; each epoch runs the adapted layers only",
                flush=True,
            )
        else:
            print(f"[glam] clone.cache_trunk: not used ({problem})", flush=True)
            trunk_seconds = math.nan
    else:
        trunk_seconds = math.nan

    parameters = [parameter for parameter in policy.parameters() if parameter.requires_grad]
    optimizer = torch.optim.AdamW(
        parameters, lr=clone.learning_rate, weight_decay=clone.weight_decay
    )
    steps_per_epoch = math.ceil(len(train) / clone.batch_size)
    scheduler = get_scheduler(
        clone.lr_scheduler, optimizer, 0, num_training_steps=clone.epochs * steps_per_epoch
    )
    counts = np.bincount(held_out.targets.numpy(), minlength=len(space.words))
    summary: dict = {
        "dataset": str(Path(clone.dataset).resolve()),
        "level": env.name,
        "action_words": list(space.words),
        "train_pairs": len(train),
        "eval_pairs": len(held_out),
        "chance_accuracy": 1.0 / len(space.words),
        "majority_accuracy": float(counts.max() / max(1, len(held_out))),
        "trunk_seconds": trunk_seconds,
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / SUMMARY_FILE).unlink(missing_ok=True)  # the mark of a finished run, written last
    (output_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(run)))
    generator = torch.Generator().manual_seed(clone.seed)
    if clone.resume and (checkpoint / PROGRESS_FILE).is_file():
        progress = _load_checkpoint(checkpoint, policy, optimizer, scheduler, generator)
        rows, step, zero_shot_choices = progress["rows"], progress["step"], progress["zero_shot"]
        print(
            f"[clone] continuing {output_dir} after epoch {rows[-1]['epoch']} of {clone.epochs} "
            f"({step} optimizer steps)",
            flush=True,
        )
        found = {"choices": progress["choices"]}
    else:
        shutil.rmtree(checkpoint, ignore_errors=True)  # an unfinished clone replaced
        found = measure(policy, held_out, clone.batch_size)
        zero_shot_choices = found["choices"]
        rows, step = [_epoch_row(0, 0, math.nan, math.nan, found)], 0
        _write_rows(output_dir / EPOCHS_FILE, rows, space.words)
        print(
            f"[glam] before training: held-out loss {rows[0]['eval_loss']:.4f}, accuracy "
            f"{rows[0]['eval_accuracy']:.3f} on {len(held_out)} decisions (always the commonest "
            f"action: {summary['majority_accuracy']:.3f})",
            flush=True,
        )
    trained_seconds = 0.0 if len(rows) == 1 else rows[-1]["seconds"]
    started = time.perf_counter() - trained_seconds
    for epoch in range(len(rows), clone.epochs + 1):
        policy.train()
        order = torch.randperm(len(train), generator=generator).tolist()
        losses = []
        bar = tqdm(
            range(0, len(train), clone.batch_size),
            desc=f"epoch {epoch}/{clone.epochs}",
            disable=not clone.progress,
            leave=False,
        )
        for start in bar:
            observations, targets = train.batch(order[start : start + clone.batch_size])
            output = policy(**observations.inputs())
            loss = F.cross_entropy(output.logits, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, clone.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        found = measure(policy, held_out, clone.batch_size)
        rows.append(
            _epoch_row(epoch, step, float(np.mean(losses)), time.perf_counter() - started, found)
        )
        _write_rows(output_dir / EPOCHS_FILE, rows, space.words)
        _save_checkpoint(
            checkpoint,
            policy,
            optimizer,
            scheduler,
            generator,
            {
                "rows": rows,
                "step": step,
                "zero_shot": zero_shot_choices,
                "choices": found["choices"],
            },
        )
        print(
            f"[glam] epoch {epoch}: training loss {rows[-1]['train_loss']:.4f}, held-out loss "
            f"{found['loss']:.4f}, held-out accuracy {found['accuracy']:.3f}",
            flush=True,
        )
    policy.save_pretrained(output_dir / POLICY_FOLDER, training_env=env)
    summary |= {
        "train_seconds": time.perf_counter() - started,
        "optimizer_steps": step,
        "zero_shot": rows[0],
        "final": rows[-1],
        "held_out_targets": held_out.targets.tolist(),
        "zero_shot_choices": zero_shot_choices,
        "final_choices": found["choices"],
        "policy": str((output_dir / POLICY_FOLDER).resolve()),
    }
    (output_dir / SUMMARY_FILE).write_text(json.dumps(mark(summary, WRITER), indent=2) + "\n")
    shutil.rmtree(checkpoint, ignore_errors=True)
    return CloneResult(output_dir, summary)


def _trained_tensors(policy: nn.Module) -> dict[str, Tensor]:
    """What training changes: the parameters that take a gradient, and the buffers (a batch
    norm's statistics); the frozen weights are loaded again from the model."""
    state = {name: p for name, p in policy.named_parameters() if p.requires_grad}
    return state | dict(policy.named_buffers())


def _trained_state(policy: nn.Module) -> dict[str, Tensor]:
    """`_trained_tensors`, copied for saving."""
    return {k: t.detach().clone().contiguous() for k, t in _trained_tensors(policy).items()}


def _save_checkpoint(
    folder: Path,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object,
    generator: torch.Generator,
    progress: dict,
) -> None:
    """Write the clone's state after an epoch into a temporary sibling of `folder`, then put it
    in `folder`'s place: a kill leaves the previous epoch's checkpoint or this one, whole."""
    partial, old = (folder.with_name(f".{folder.name}.{end}") for end in ("partial", "old"))
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    save_file(_trained_state(policy), partial / "trained.safetensors")
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "generator": generator.get_state(),
        },
        partial / "training_state.pt",
    )
    (partial / PROGRESS_FILE).write_text(json.dumps(progress))
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def _load_checkpoint(
    folder: Path,
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: object,
    generator: torch.Generator,
) -> dict:
    """Restore what `_save_checkpoint` wrote; return its progress (the figures so far)."""
    tensors = load_file(folder / "trained.safetensors")
    expected = _trained_tensors(policy).keys()
    if tensors.keys() != expected:
        raise CloneResumeError(
            f"the checkpoint in {folder} trained other weights than this policy trains "
            f"({sorted(set(tensors) ^ set(expected))[:3]}...): clone.overwrite=true starts again"
        )
    policy.load_state_dict(tensors, strict=False)
    state = torch.load(folder / "training_state.pt", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    generator.set_state(state["generator"])
    return json.loads((folder / PROGRESS_FILE).read_text())


def _check_same_clone(output_dir: Path, run: CloneRunConfig) -> None:
    """Refuse to continue a clone made with other settings (those of `UNCHECKED_KEYS` aside).

    Raises:
        CloneResumeError: naming the first settings that differ.
    """
    saved = OmegaConf.to_container(OmegaConf.load(output_dir / "config.yaml"))
    now = OmegaConf.to_container(OmegaConf.structured(run))
    for config in (saved, now):
        for key in UNCHECKED_KEYS:
            config["clone"].pop(key, None)
    differ = [
        f"{section}.{key}: {saved[section].get(key)!r} then, {value!r} now"
        for section, values in now.items()
        for key, value in values.items()
        if saved.get(section, {}).get(key) != value
    ]
    if differ:
        raise CloneResumeError(
            f"{output_dir} holds a clone made with other settings ({'; '.join(differ[:3])}): "
            "set them back, or clone.overwrite=true to start again"
        )


def split_decisions(pairs: Dataset, clone: CloneConfig) -> tuple[Dataset, Dataset]:
    """The training pairs and the held-out pairs measured (SFT's split by episode, then the
    first `clone.max_eval_pairs` held-out ones)."""
    train_pairs, eval_pairs = split_pairs(pairs, clone.eval_fraction, clone.seed)
    if clone.max_eval_pairs is not None:
        eval_pairs = eval_pairs.select(range(min(clone.max_eval_pairs, len(eval_pairs))))
    return train_pairs, eval_pairs


@torch.no_grad()
def _keep_trunk(
    policy: LLMActorCritic, decisions: DecisionSet, batch_size: int, progress: bool
) -> None:
    """Compute the frozen trunk's states of every decision once; they ride with its prompts."""
    policy.eval()
    kept = []
    observations = decisions.observations
    starts = range(0, len(decisions), batch_size)
    for start in tqdm(starts, desc="frozen trunk", disable=not progress, leave=False):
        part = observations.select(range(start, min(start + batch_size, len(decisions))))
        kept.extend(policy(**part.inputs()).trunk)
    decisions.observations = observations.with_trunk(kept)


@torch.no_grad()
def measure(policy: nn.Module, decisions: DecisionSet, batch_size: int) -> dict:
    """The policy's held-out cross-entropy, accuracy (its most probable action is the
    demonstrated one), mean probability of the demonstrated action, how often it would pick
    each action (`chosen`) and which it picks for each decision (`choices`), on `decisions`."""
    was_training = policy.training
    policy.eval()
    logits = []
    for start in range(0, len(decisions), batch_size):
        observations, _ = decisions.batch(
            list(range(start, min(start + batch_size, len(decisions))))
        )
        logits.append(policy(**observations.inputs()).logits.float())
    policy.train(was_training)
    scores = torch.cat(logits)
    targets = decisions.targets
    chosen = scores.argmax(dim=-1)
    probabilities = scores.softmax(dim=-1)
    return {
        "loss": F.cross_entropy(scores, targets).item(),
        "accuracy": (chosen == targets).float().mean().item(),
        "target_probability": probabilities.gather(1, targets[:, None]).mean().item(),
        "chosen": np.bincount(chosen.numpy(), minlength=scores.shape[1]) / len(decisions),
        "choices": chosen.tolist(),
    }


def _epoch_row(epoch: int, step: int, train_loss: float, seconds: float, found: dict) -> dict:
    return {
        "epoch": epoch,
        "optimizer_steps": step,
        "train_loss": train_loss,
        "eval_loss": found["loss"],
        "eval_accuracy": found["accuracy"],
        "eval_target_probability": found["target_probability"],
        "chosen": [float(share) for share in found["chosen"]],
        "seconds": seconds,
    }


def _write_rows(path: Path, rows: list[dict], action_words: tuple[str, ...]) -> None:
    """`clone.csv` again with every epoch so far (a crash keeps the finished epochs)."""
    columns = [key for key in rows[0] if key != "chosen"]
    chosen = [f"chosen_{word.replace(' ', '_')}" for word in action_words]
    partial = path.with_suffix(".csv.partial")
    with partial.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns + chosen)
        for row in rows:
            writer.writerow([row[key] for key in columns] + row["chosen"])
    partial.replace(path)
