"""A pretrained language model as an actor-critic over text actions.

Actor: a `Categorical` over each prompt's candidate actions, whose logits are the candidates'
log-likelihood scores (`head="scoring"`, the paper's GFlan-T5), or one logit per action from an
MLP on the prompt representation (`head="action_heads"`, the paper's AFlan-T5 and, with random
weights, NPAE). Critic: an MLP on the same prompt representation, taken from the scoring forward
itself (no second pass), or, with `value_from_base=True`, from the frozen base model with the LoRA
adapter switched off (TWOSOME), so the critic cannot pull the policy's features around.

Checkpoints are safetensors + JSON only (never pickles): the adapter in peft format, or the whole
model; the heads in `heads.safetensors`; the configs in `glam_policy.json`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torch.distributions import Categorical
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from glam.config import AdapterConfig, ModelConfig, PolicyConfig
from glam.models.loading import DTYPES, load_model
from glam.policy.adapters import (
    apply_lora,
    disable_dropout,
    enable_gradient_checkpointing,
    quiet_peft,
)
from glam.policy.heads import ActionHeads, ValueHead
from glam.scoring import prompt_hidden_states, score_candidates, unwrap_model

CONFIG_FILE = "glam_policy.json"
HEADS_FILE = "heads.safetensors"
FORMAT_VERSION = 1


@dataclass
class PolicyOutput:
    """What the policy says about a batch of prompts."""

    logits: Tensor
    """(B, C_max) unnormalised log-probabilities of the candidates; -inf where absent."""
    values: Tensor
    """(B,) state values."""
    mask: Tensor
    """(B, C_max) True where a candidate exists."""

    @property
    def dist(self) -> Categorical:
        """The action distribution over each prompt's candidates."""
        return Categorical(logits=self.logits)


class LLMActorCritic(nn.Module):
    """Actor-critic over text actions around a causal or encoder-decoder language model.

    `model` is used as given (a plain model is fully fine-tuned; a `PeftModel` trains its
    adapter); `from_model` and `from_config` apply LoRA and gradient checkpointing from a
    `ModelConfig`. `action_words` are the env's actions, in order: the default candidates, and
    the outputs of the action-heads variant.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        policy_cfg: PolicyConfig | None = None,
        action_words: Sequence[str] = (),
        *,
        model_cfg: ModelConfig | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer
        self.policy_cfg = policy_cfg or PolicyConfig()
        self.model_cfg = model_cfg
        self.action_words = list(action_words)
        cfg = self.policy_cfg
        if cfg.value_from_base and not isinstance(model, PeftModel):
            raise ValueError(
                "value_from_base=True computes the value with the LoRA adapter switched off, but "
                "the model has no adapter (full fine-tuning); enable model.lora or share the value"
            )
        if cfg.head == "action_heads" and not self.action_words:
            raise ValueError("head='action_heads' needs the action words (one logit per action)")
        hidden_size = unwrap_model(model).config.get_text_config().hidden_size
        self.value_head = ValueHead(hidden_size, cfg.value_hidden_sizes, cfg.value_activation)
        self.action_heads = (
            ActionHeads(
                hidden_size, len(self.action_words), cfg.value_hidden_sizes, cfg.value_activation
            )
            if cfg.head == "action_heads"
            else None
        )

    # ----------------------------------------------------------------------------------------
    # Construction
    # ----------------------------------------------------------------------------------------

    @classmethod
    def from_model(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        model_cfg: ModelConfig,
        policy_cfg: PolicyConfig,
        action_words: Sequence[str],
    ) -> LLMActorCritic:
        """Wrap an already loaded model: dropout off, LoRA or full fine-tuning, gradient
        checkpointing."""
        if model_cfg.disable_dropout:
            disable_dropout(model)
        if model_cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        if model_cfg.lora.enabled:
            model = apply_lora(model, model_cfg.lora)
        else:
            model.requires_grad_(True)
        return cls(model, tokenizer, policy_cfg, action_words, model_cfg=model_cfg)

    @classmethod
    def from_config(
        cls, model_cfg: ModelConfig, policy_cfg: PolicyConfig, action_words: Sequence[str]
    ) -> LLMActorCritic:
        """Load the model named by `model_cfg` (random weights but its embeddings for NPAE)."""
        model, tokenizer = load_model(
            model_cfg.name_or_path,
            dtype=model_cfg.dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            pretrained=model_cfg.pretrained,
        )
        return cls.from_model(model, tokenizer, model_cfg, policy_cfg, action_words)

    # ----------------------------------------------------------------------------------------
    # Forward
    # ----------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        enabled = bool(self.model_cfg and self.model_cfg.autocast_bf16)
        device_type = unwrap_model(self.model).device.type
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=enabled)

    def _check_action_candidates(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> None:
        if len(prompts) != len(candidates):
            raise ValueError(
                f"prompts and candidates have different lengths ({len(prompts)} prompts, "
                f"{len(candidates)} candidate lists): give one list of candidates per prompt"
            )
        for i, actions in enumerate(candidates):
            if list(actions) != self.action_words:
                raise ValueError(
                    f"head='action_heads' has one output per action word, in order, but "
                    f"candidates[{i}] is {list(actions)}, not {self.action_words}"
                )

    def forward(
        self, prompts: list[str], candidates: list[list[str]] | None = None
    ) -> PolicyOutput:
        """Action logits and values for a batch of prompts.

        `candidates[i]` are the actions available after `prompts[i]` (ragged lists allowed with
        `head="scoring"`); None means the action words for every prompt.
        """
        cfg = self.policy_cfg
        if candidates is None:
            if not self.action_words:
                raise ValueError("no candidates given and the policy has no action words")
            candidates = [self.action_words] * len(prompts)
        if cfg.head == "scoring":
            with self._autocast():
                scored = score_candidates(
                    self.model,
                    self.tokenizer,
                    prompts,
                    candidates,
                    cfg.normalization,
                    append_eos=cfg.append_eos,
                )
            logits, mask, hidden = scored.scores, scored.mask, scored.prompt_hidden
        else:
            self._check_action_candidates(prompts, candidates)
            with self._autocast():
                hidden = prompt_hidden_states(self.model, self.tokenizer, prompts)
            logits = self.action_heads(hidden)
            mask = torch.ones_like(logits, dtype=torch.bool)
        if cfg.value_from_base:
            with torch.no_grad(), self.model.disable_adapter(), self._autocast():
                hidden = prompt_hidden_states(self.model, self.tokenizer, prompts)
        logits = logits.float() / cfg.temperature  # -inf (absent candidates) stays -inf
        return PolicyOutput(logits=logits, values=self.value_head(hidden), mask=mask)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimiser should update (adapter or whole model, and the heads)."""
        return [p for p in self.parameters() if p.requires_grad]

    # ----------------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path, *, include_base: bool | None = None) -> Path:
        """Write the policy to a folder; `LLMActorCritic.from_pretrained` reads it back.

        An adapter is saved in peft format under `adapter/` (`PeftModel.from_pretrained` loads
        it). The base weights are saved too (`base/`) unless they can be reloaded from
        `model_cfg.name_or_path`, i.e. unless `include_base` is False or, by default, the
        model is pretrained and named by a config. Without an adapter the whole model goes to
        `model/`. Heads go to `heads.safetensors`, configs to `glam_policy.json`.
        """
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if isinstance(self.model, PeftModel):
            if include_base is None:
                include_base = not (self.model_cfg and self.model_cfg.pretrained)
            self.model.save_pretrained(path / "adapter")
            weights = "adapter+base" if include_base else "adapter"
            if include_base:
                self._save_clean_base(path / "base")
        else:
            self.model.save_pretrained(path / "model")
            self.tokenizer.save_pretrained(path / "model")
            weights = "full"
        heads = {f"value_head.{k}": v for k, v in self.value_head.state_dict().items()}
        if self.action_heads is not None:
            heads |= {f"action_heads.{k}": v for k, v in self.action_heads.state_dict().items()}
        save_file({k: v.detach().contiguous().cpu() for k, v in heads.items()}, path / HEADS_FILE)
        dtype = next(k for k, v in DTYPES.items() if v == unwrap_model(self.model).dtype)
        meta = {
            "format_version": FORMAT_VERSION,
            "weights": weights,
            "dtype": dtype,
            "model": asdict(self.model_cfg) if self.model_cfg else None,
            "policy": asdict(self.policy_cfg),
            "action_words": self.action_words,
        }
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return path

    def _save_clean_base(self, folder: Path) -> None:
        """The base weights without LoRA's modules, under their original names."""
        base = self.model.get_base_model()
        state = {
            k.replace(".base_layer.", "."): v
            for k, v in base.state_dict().items()
            if "lora_" not in k
        }
        base.save_pretrained(folder, state_dict=state)
        self.tokenizer.save_pretrained(folder)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> LLMActorCritic:
        """Restore a policy written by `save_pretrained` (adapter trainable, heads loaded)."""
        path = Path(path)
        meta = json.loads((path / CONFIG_FILE).read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{path / CONFIG_FILE}: unknown format {meta.get('format_version')}")
        model_cfg = _model_config(meta["model"]) if meta["model"] else None
        policy_cfg = PolicyConfig(**meta["policy"])
        trust = bool(model_cfg and model_cfg.trust_remote_code)
        weights = meta["weights"]
        if weights == "full":
            model, tokenizer = load_model(
                str(path / "model"), dtype=meta["dtype"], trust_remote_code=trust
            )
            if model_cfg is None or model_cfg.disable_dropout:
                disable_dropout(model)
        else:
            source = str(path / "base") if weights == "adapter+base" else model_cfg.name_or_path
            base, tokenizer = load_model(source, dtype=meta["dtype"], trust_remote_code=trust)
            if model_cfg.disable_dropout:
                disable_dropout(base)
            with quiet_peft():
                model = PeftModel.from_pretrained(base, path / "adapter", is_trainable=True)
        if model_cfg and model_cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        policy = cls(model, tokenizer, policy_cfg, meta["action_words"], model_cfg=model_cfg)
        heads = load_file(path / HEADS_FILE)
        policy.value_head.load_state_dict(_with_prefix(heads, "value_head."))
        if policy.action_heads is not None:
            policy.action_heads.load_state_dict(_with_prefix(heads, "action_heads."))
        return policy


def _with_prefix(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def _model_config(data: dict) -> ModelConfig:
    return ModelConfig(**{**data, "lora": AdapterConfig(**data["lora"])})
