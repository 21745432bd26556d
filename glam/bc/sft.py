"""Behavioural cloning: supervised fine-tuning of the LLM on (prompt, action) pairs with TRL.

The pairs are given to TRL's `SFTTrainer` in prompt-completion form, already tokenized: the
completion is the action exactly as the policy's scorer tokenizes a candidate (leading space,
no end-of-sequence token), and `completion_mask` marks it, so with `completion_only_loss` the
loss covers the action tokens only; the prompt and the padding are -100 in the labels. (TRL's
own tokenization would append EOS to every completion and train it too, and the original GLAM
code forgot to mask the padding.)

Decoder-only models go through TRL's loss; encoder-decoder models read the prompt in the encoder
and the action as decoder labels, with the same per-token loss (see `ActionSFTTrainer`).
Held-out action accuracy is the argmax of the policy's own scorer over the action space.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset
from omegaconf import OmegaConf
from rich.progress import Progress, track
from transformers import PreTrainedModel, PreTrainedTokenizerBase, set_seed
from trl import SFTConfig, SFTTrainer

from babyai_text.actions import ActionSpace, get_action_space
from glam.bc.config import BCRunConfig
from glam.bc.episodes import greedy_success_rate
from glam.demos import DemoDatasetError, demo_metadata, load_demos, split_pairs
from glam.models.loading import load_model
from glam.models.precision import gpu_mixed_precision
from glam.policy.adapters import apply_lora
from glam.policy.bc_policy import BC_POLICY_FILE, BCPolicyInfo
from glam.scoring import score_actions, tokenize_candidates

__all__ = [
    "ActionSFTTrainer",
    "BCResult",
    "HeldOutActions",
    "action_accuracy",
    "dataset_action_space",
    "encode_pairs",
    "train_bc",
]


@dataclass
class HeldOutActions:
    """Held-out decisions whose action the model should rank first among the action words."""

    prompts: list[str]
    targets: list[int]
    """Index of the demonstrated action in `action_words`, per prompt."""
    action_words: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def from_dataset(
        cls, pairs: Dataset, space: ActionSpace, limit: int | None = None
    ) -> HeldOutActions:
        """The first `limit` pairs of `pairs` (all when None)."""
        if limit is not None:
            pairs = pairs.select(range(min(limit, len(pairs))))
        return cls(
            prompts=list(pairs["prompt"]),
            targets=[space.index(action) for action in pairs["action"]],
            action_words=space.words,
        )


@torch.no_grad()
def action_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    held_out: HeldOutActions,
    *,
    normalization: str = "sum",
    batch_size: int = 8,
    progress: bool = False,
) -> float:
    """Fraction of `held_out` whose demonstrated action gets the policy scorer's highest score."""
    was_training = model.training
    model.eval()
    correct = 0
    starts = range(0, len(held_out), batch_size)
    for start in track(starts, "action accuracy", disable=not progress, transient=True):
        prompts = held_out.prompts[start : start + batch_size]
        candidates = [list(held_out.action_words)] * len(prompts)
        scores = torch.stack(  # (batch, actions)
            score_actions(model, tokenizer, prompts, candidates, normalization=normalization)
        )
        targets = torch.tensor(held_out.targets[start : start + batch_size])
        correct += int((scores.argmax(dim=-1).cpu() == targets).sum())
    model.train(was_training)
    return correct / len(held_out)


def dataset_action_space(pairs: Dataset) -> ActionSpace:
    """The one action space of a demonstrations dataset (its `action_space` column, else the
    default), after checking that every action is one of its words.

    Raises:
        DemoDatasetError: several action spaces, an unknown one, or actions outside it.
    """
    names = sorted(set(pairs["action_space"])) if "action_space" in pairs.column_names else []
    if len(names) > 1:
        raise DemoDatasetError(f"the demonstrations mix action spaces {names}; keep one")
    try:
        space = get_action_space(names[0] if names else "default")
    except ValueError as error:
        raise DemoDatasetError(str(error)) from None
    unknown = sorted(set(pairs["action"]) - set(space.words))
    if unknown:
        raise DemoDatasetError(
            f"actions {unknown[:5]} are not in the action space {space.name!r} {list(space.words)}"
        )
    return space


def encode_pairs(
    pairs: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    *,
    is_encoder_decoder: bool,
    max_length: int,
) -> Dataset:
    """Tokenize (prompt, action) pairs the way the policy's scorer does.

    Returns a dataset with `input_ids` and, for decoder-only models, `completion_mask` (1 on
    the action tokens), or, for encoder-decoder models, `labels` (the action tokens the decoder
    must produce).

    Raises:
        DemoDatasetError: a pair longer than `max_length` tokens.
    """

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        # The scorer's own tokenisation of each (prompt, [action]): the completion tokens are
        # exactly the tokens it scores, whatever happens at the prompt/action boundary.
        tokens = tokenize_candidates(
            tokenizer,
            batch["prompt"],
            [[action] for action in batch["action"]],
            encoder_decoder=is_encoder_decoder,
        )
        prompt_ids = [
            ids[:length].tolist()
            for ids, length in zip(tokens.prompt_ids, tokens.prompt_lengths, strict=True)
        ]
        action_ids = [
            ids[:length].tolist()
            for ids, length in zip(tokens.candidate_ids, tokens.candidate_lengths, strict=True)
        ]
        if is_encoder_decoder:
            return {"input_ids": prompt_ids, "labels": action_ids}
        return {
            "input_ids": [p + a for p, a in zip(prompt_ids, action_ids, strict=True)],
            "completion_mask": [
                [0] * len(p) + [1] * len(a) for p, a in zip(prompt_ids, action_ids, strict=True)
            ],
        }

    encoded = pairs.map(encode, batched=True, remove_columns=pairs.column_names)
    longest = max(len(ids) for ids in encoded["input_ids"])
    if longest > max_length:
        raise DemoDatasetError(
            f"a pair is {longest} tokens long, more than bc.max_length={max_length}; raise "
            "bc.max_length (or collect with a smaller demos.nbr_obs)"
        )
    return encoded


class ActionSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer that also measures held-out action accuracy, and trains encoder-decoders.

    `evaluate` adds `{prefix}_action_accuracy`: the fraction of held-out prompts whose
    demonstrated action the policy's scorer ranks first.
    """

    def __init__(
        self,
        *args: Any,
        held_out: HeldOutActions | None = None,
        normalization: str = "sum",
        score_batch_size: int = 8,
        progress: bool = True,
        **kwargs: Any,
    ) -> None:
        self.held_out = held_out
        self.normalization = normalization
        self.score_batch_size = score_batch_size
        self.progress = progress
        super().__init__(*args, **kwargs)
        self.is_encoder_decoder = bool(self.model.config.is_encoder_decoder)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        if not self.is_encoder_decoder:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # TRL's fused loss assumes a decoder-only model; here the prompt is the encoder's input and
        # the labels (-100 on padding) are the decoder's targets. Summed then divided by the
        # label tokens of the whole accumulated batch, as TRL does for causal models.
        labels = inputs["labels"]
        outputs = model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels
        )
        loss = F.cross_entropy(
            outputs.logits.flatten(0, 1).float(),
            labels.flatten(),
            ignore_index=-100,
            reduction="sum",
        )
        num_tokens = (labels != -100).sum() if num_items_in_batch is None else num_items_in_batch
        loss = loss / torch.as_tensor(num_tokens, device=loss.device).clamp(min=1)
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss

    def evaluate(
        self,
        eval_dataset: Dataset | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> dict[str, float]:
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        if self.held_out is not None and len(self.held_out):
            key = f"{metric_key_prefix}_action_accuracy"
            metrics[key] = action_accuracy(
                self.model,
                self.processing_class,
                self.held_out,
                normalization=self.normalization,
                batch_size=self.score_batch_size,
                progress=self.progress,
            )
            self.log({key: metrics[key]})
        return metrics


@dataclass
class BCResult:
    """What a BC run produced."""

    output_dir: Path
    """The saved policy folder (adapter or full model, tokenizer, `bc_policy.json`)."""
    metrics: dict[str, float]
    """Namespaced figures: `eval/action_accuracy`, `eval/zero_shot_action_accuracy`, ..."""
    info: BCPolicyInfo


# TrainingArguments' `gradient_checkpointing` is `activation_checkpointing` in recent transformers
# (5.17, on the GPU machines of docs/gpu.md, has the old name only).
_CHECKPOINTING = next(
    name
    for name in ("activation_checkpointing", "gradient_checkpointing")
    if name in {field.name for field in fields(SFTConfig)}
)


def build_sft_config(run: BCRunConfig, output_dir: Path) -> SFTConfig:
    """TRL's settings from glam's: AdamW, schedule, batch, completion-only loss, no checkpoints."""
    bc, model = run.bc, run.model
    eval_strategy = "steps" if bc.eval_steps else "no"
    return SFTConfig(
        output_dir=str(output_dir),
        learning_rate=bc.learning_rate,
        lr_scheduler_type=bc.lr_scheduler,
        warmup_steps=bc.warmup_steps,
        weight_decay=bc.weight_decay,
        optim="adamw_torch",
        num_train_epochs=bc.epochs,
        max_steps=bc.max_steps,
        per_device_train_batch_size=bc.batch_size,
        per_device_eval_batch_size=bc.batch_size,
        gradient_accumulation_steps=bc.gradient_accumulation_steps,
        max_grad_norm=bc.max_grad_norm,
        max_length=bc.max_length,
        completion_only_loss=True,
        eval_strategy=eval_strategy,
        eval_steps=bc.eval_steps if eval_strategy == "steps" else None,
        prediction_loss_only=True,  # accuracy comes from the scorer, not from the logits
        save_strategy="no",
        logging_steps=bc.logging_steps,
        report_to=bc.report_to,
        seed=bc.seed,
        data_seed=bc.seed,
        # null (auto): bf16 on a GPU that computes it natively, fp32 on the CPU (BC's figures)
        bf16=gpu_mixed_precision(model.autocast_bf16)[0],
        tf32=gpu_mixed_precision(model.autocast_bf16)[1] or None,  # None: torch's default
        **{_CHECKPOINTING: model.gradient_checkpointing},
        disable_tqdm=not bc.progress,
    )


def train_bc(run: BCRunConfig) -> BCResult:
    """Clone the demonstrations of `run.bc.dataset` into `run.model`; save and return the policy.

    Raises:
        glam.outputs.OutputDirError: `bc.output_dir` cannot take the policy: a file, not
            writable, holding a training run or another output, not empty; an
            `OutputExistsError` (a `FileExistsError`) when it holds a BC policy and `bc.overwrite`
            is false (checked first, before anything is loaded).
        DemoDatasetError: the dataset is missing, empty, malformed, cannot be split, has a pair
            longer than `bc.max_length`, or spans several levels with no `bc.success_level`.
    """
    bc = run.bc
    output_dir = bc.check_output_dir()
    pairs = load_demos(bc.dataset, keep_in_memory=True)  # no cache file in the dataset's folder
    if bc.max_pairs is not None:
        pairs = pairs.select(range(min(bc.max_pairs, len(pairs))))
    space = dataset_action_space(pairs)
    collected_with = demo_metadata(pairs)
    nbr_obs = int(collected_with.get("nbr_obs", 3))
    success_level = bc.success_level or _single(pairs, "level")
    if bc.success_episodes and success_level is None:
        raise DemoDatasetError("the demonstrations span several levels: set bc.success_level")
    train_pairs, eval_pairs = split_pairs(pairs, bc.eval_fraction, bc.seed)

    set_seed(bc.seed)  # the LoRA initialisation
    model, tokenizer = load_model(
        run.model.name_or_path,
        dtype=run.model.dtype,
        trust_remote_code=run.model.trust_remote_code,
        pretrained=run.model.pretrained,
    )
    is_encoder_decoder = bool(model.config.is_encoder_decoder)
    if run.model.lora.enabled:
        model = apply_lora(model, run.model.lora)
    encode = {"tokenizer": tokenizer, "is_encoder_decoder": is_encoder_decoder}
    trainer = ActionSFTTrainer(
        model=model,
        args=build_sft_config(run, output_dir),
        train_dataset=encode_pairs(train_pairs, max_length=bc.max_length, **encode),
        eval_dataset=encode_pairs(eval_pairs, max_length=bc.max_length, **encode),
        processing_class=tokenizer,
        held_out=HeldOutActions.from_dataset(eval_pairs, space, bc.max_eval_pairs),
        normalization=bc.normalization,
        score_batch_size=bc.score_batch_size,
        progress=bc.progress,
    )
    metrics: dict[str, float] = {
        "data/train_pairs": len(train_pairs),
        "data/eval_pairs": len(eval_pairs),
        "data/accuracy_pairs": len(trainer.held_out),
        "data/chance_accuracy": 1.0 / len(space),
        "data/majority_accuracy": _majority_accuracy(trainer.held_out),
    }

    def measure(key_prefix: str, name_prefix: str) -> None:
        """Held-out loss and action accuracy, and greedy success when asked for."""
        found = trainer.evaluate(metric_key_prefix=key_prefix)
        for name in ("loss", "action_accuracy"):
            metrics[f"eval/{name_prefix}{name}"] = found[f"{key_prefix}_{name}"]
        if bc.success_episodes and trainer.is_world_process_zero():
            success = _success_rate(
                trainer.model, tokenizer, run, success_level, collected_with, space
            )
            metrics.update({f"eval/{name_prefix}{key}": value for key, value in success.items()})

    if bc.eval_before_training:
        measure("zero_shot", "zero_shot_")  # LoRA starts as the identity: the base model
    train_output = trainer.train()
    metrics["train/loss"] = train_output.training_loss
    metrics["train/steps"] = train_output.global_step
    metrics["train/seconds"] = train_output.metrics.get("train_runtime", math.nan)
    measure("eval", "")

    info = BCPolicyInfo(
        base_model=_portable_spec(run.model.name_or_path),
        adapter=run.model.lora.enabled,
        is_encoder_decoder=is_encoder_decoder,
        dtype=run.model.dtype,
        nbr_obs=nbr_obs,
        action_space=space.name,
        prompt_format=str(collected_with.get("prompt_format", "glam")),
        normalization=bc.normalization,
        level=_single(pairs, "level"),
        dataset=str(Path(bc.dataset).resolve()),
        metrics=metrics,
    )
    if trainer.is_world_process_zero():
        save_policy(trainer, tokenizer, output_dir, info, run)
    return BCResult(output_dir=output_dir, metrics=metrics, info=info)


def _success_rate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    run: BCRunConfig,
    level: str,
    collected_with: dict[str, Any],
    space: ActionSpace,
) -> dict[str, float]:
    bc = run.bc
    with Progress(disable=not bc.progress, transient=True) as bar:
        task = bar.add_task("greedy episodes", total=bc.success_episodes)
        summary = greedy_success_rate(
            model,
            tokenizer,
            level=level,
            episodes=bc.success_episodes,
            seed_base=bc.success_seed,
            nbr_obs=int(collected_with.get("nbr_obs", 3)),
            action_space=space.name,
            prompt_format=str(collected_with.get("prompt_format", "glam")),
            normalization=bc.normalization,
            num_envs=bc.score_batch_size,
            on_episode_end=lambda *_: bar.advance(task),
        )
    keys = ("success_rate", "ci_low", "ci_high", "mean_return", "mean_length")
    return {f"{'success_' if key.startswith('ci') else ''}{key}": summary[key] for key in keys}


def save_policy(
    trainer: SFTTrainer,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: Path,
    info: BCPolicyInfo,
    run: BCRunConfig | None = None,
) -> None:
    """Save the adapter (or full model), the tokenizer, the run's config, metrics, then
    `bc_policy.json`.

    `bc_policy.json` is written last: a folder without it is an interrupted save, and
    `load_bc_policy` refuses it. Replacing a policy (`bc.overwrite`) removes the old one first,
    so that an interrupted save never passes for the old policy.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / BC_POLICY_FILE).unlink(missing_ok=True)
    if run is not None:
        config_yaml = OmegaConf.to_yaml(OmegaConf.structured(run))
        (output_dir / "config.yaml").write_text(config_yaml)
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    (output_dir / "metrics.json").write_text(json.dumps(info.metrics, indent=2) + "\n")
    info.save(output_dir)


def _majority_accuracy(held_out: HeldOutActions) -> float:
    counts = np.bincount(held_out.targets, minlength=len(held_out.action_words))
    return float(counts.max() / max(1, len(held_out)))


def _single(pairs: Dataset, column: str) -> str | None:
    if column not in pairs.column_names:
        return None
    values: Sequence[str] = sorted(set(pairs[column]))
    return values[0] if len(values) == 1 else None


def _portable_spec(spec: str) -> str:
    """A local folder becomes absolute (so the policy loads from anywhere); names stay names."""
    path = Path(spec).expanduser()
    return str(path.resolve()) if path.exists() else spec
