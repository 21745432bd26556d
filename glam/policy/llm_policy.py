"""A pretrained language model as an actor-critic over text actions.

Actor: a `Categorical` over each prompt's candidate actions, whose logits are the candidates'
log-likelihood scores (`head="scoring"`, the paper's GFlan-T5), or one logit per action from an
MLP on the prompt representation (`head="action_heads"`, the paper's AFlan-T5 and, with random
weights, NPAE). Critic: an MLP on the same prompt representation, taken from the scoring forward
itself (no second pass), or, with `value_from_base=True`, from the frozen base model with the LoRA
adapter switched off (TWOSOME), so the critic cannot pull the policy's features around.

Checkpoints are safetensors + JSON only (never pickles): the adapter in peft format, or the whole
model; the heads in `heads.safetensors`; the configs and the training env in `glam_policy.json`.
Loading one runs no code from it unless the caller allows it (`trust_remote_code`), and a
missing, truncated or malformed file is a `CheckpointError` that names it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from glam.config import AdapterConfig, EnvConfig, ModelConfig, PolicyConfig
from glam.models.loading import DTYPES, load_model
from glam.policy.adapters import (
    apply_lora,
    disable_dropout,
    enable_gradient_checkpointing,
    quiet_peft,
    train_only_layers,
)
from glam.policy.files import (
    CONFIG_FILE,
    FORMAT_VERSION,
    CheckpointError,
    check_env_record,
    check_safetensors,
    env_record,
    read_policy_config,
)
from glam.policy.heads import ActionHeads, ValueHead
from glam.policy.output import PolicyOutput
from glam.scoring import (
    TrunkCut,
    model_kind,
    prompt_hidden_states,
    prompt_states,
    score_candidates,
    unwrap_model,
)
from glam.trunk import TrunkStates, layer_stack, trainable_layers

HEADS_FILE = "heads.safetensors"

SETTINGS_BEFORE_THEIR_FIELD: dict[str, dict[str, Any]] = {
    "policy": {
        # Added with 1 as its default; the policy was the softmax of the raw scores before.
        "temperature": 1.0,
        # Added when other agents joined; every policy folder before was a language model's.
        "kind": "llm",
        # Added with False as its default; the value head read its input as it was before.
        "value_norm": False,
        # Added with False as its default; the value head read the state alone before.
        "value_time": False,
    },
    "model": {
        # Added with True as its default; the base model's dropout was left on before.
        "disable_dropout": False,
        # Added with None as its default; a full fine-tuning trained every layer before.
        "trained_layers": None,
    },
}
"""`PolicyConfig` and `ModelConfig` fields added after the first `glam_policy.json` of this
format, with the value a policy saved before the field existed was trained with. A field missing
from a saved file takes this value, not today's dataclass default, which may differ
(`temperature` is now 5, the default preset's): a folder loads as the policy that was saved.
A new field of either dataclass gets its entry here."""


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
        self.training_env: dict[str, Any] | None = None
        """The settings of the env the policy was trained on (`EnvConfig`'s fields, as recorded
        by `save_pretrained`), when known. A plain dict: a record written by an older version
        stays readable whatever fields `EnvConfig` gains or loses."""
        cfg = self.policy_cfg
        if cfg.value_from_base and not isinstance(model, PeftModel):
            raise ValueError(
                "value_from_base=True computes the value with the LoRA adapter switched off, but "
                "the model has no adapter (full fine-tuning); enable model.lora or share the value"
            )
        if cfg.head == "action_heads" and not self.action_words:
            raise ValueError("head='action_heads' needs the action words (one logit per action)")
        if cfg.prompt_format == "chat" and not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                f"policy.prompt_format=chat renders the model's chat template, and "
                f"{type(tokenizer).__name__} has none (a base model, such as gemma3-270m); use "
                "policy.prompt_format=glam"
            )
        self.trunk_cut: TrunkCut | None = None
        """Where the frozen trunk ends once `enable_trunk_cache` was called; None: off."""
        hidden_size = unwrap_model(model).config.get_text_config().hidden_size
        self.value_head = ValueHead(
            hidden_size, cfg.value_hidden_sizes, cfg.value_activation, cfg.value_norm,
            time=cfg.value_time,
        )  # fmt: skip
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
        elif model_cfg.trained_layers is not None:
            train_only_layers(model, model_cfg.trained_layers)
        else:
            model.requires_grad_(True)
        return cls(model, tokenizer, policy_cfg, action_words, model_cfg=model_cfg)

    @classmethod
    def from_config(
        cls,
        model_cfg: ModelConfig,
        policy_cfg: PolicyConfig,
        action_words: Sequence[str],
        *,
        training_env: EnvConfig | Mapping[str, Any] | None = None,
    ) -> LLMActorCritic:
        """Load the model named by `model_cfg` (random weights but its embeddings for NPAE).

        `training_env`, the env the policy is trained on, is recorded by `save_pretrained`.
        """
        model, tokenizer = load_model(
            model_cfg.name_or_path,
            dtype=model_cfg.dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            pretrained=model_cfg.pretrained,
        )
        policy = cls.from_model(model, tokenizer, model_cfg, policy_cfg, action_words)
        policy.training_env = env_record(training_env)
        return policy

    # ----------------------------------------------------------------------------------------
    # Forward
    # ----------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast around the language model when `model.autocast_bf16` asks for it.

        Otherwise the autocast state is left as the caller set it: an `enabled=False` here would
        switch off an outer autocast too (Accelerate's under `mixed_precision: bf16`), and the
        language model would silently run in fp32. The heads run in fp32 either way (`run_fp32`).
        """
        if not (self.model_cfg and self.model_cfg.autocast_bf16):
            return contextlib.nullcontext()
        device_type = unwrap_model(self.model).device.type
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)

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
        self,
        prompts: list[str],
        candidates: list[list[str]] | None = None,
        trunk: Sequence[TrunkStates] | None = None,
        elapsed: Sequence[float] | None = None,
    ) -> PolicyOutput:
        """Action logits and values for a batch of prompts.

        `candidates[i]` are the actions available after `prompts[i]` (ragged lists allowed with
        `head="scoring"`); None means the action words for every prompt. `elapsed[i]`: the
        share of its time limit the episode of `prompts[i]` has used, which the value head reads
        with `policy.value_time` (an evaluation, which needs no value, may leave it out: the
        values are then those of an episode's first step).

        Once `enable_trunk_cache` was called, a forward without `trunk` returns the frozen
        trunk's states of each prompt (`PolicyOutput.trunk`); a forward given them back as
        `trunk` (same prompts and candidates, any batch) runs only the adapted layers, to the
        same output.
        """
        cfg = self.policy_cfg
        if candidates is None:
            if not self.action_words:
                raise ValueError("no candidates given and the policy has no action words")
            candidates = [self.action_words] * len(prompts)
        cut = self.trunk_cut
        if trunk is not None and cut is None:
            raise ValueError("trunk states were given to a policy whose trunk cache is off")
        cached = None if trunk is None else [states.hidden for states in trunk]
        if cfg.head == "scoring":
            with self._autocast():
                scored = score_candidates(
                    self.model,
                    self.tokenizer,
                    prompts,
                    candidates,
                    cfg.normalization,
                    append_eos=cfg.append_eos,
                    trunk_cut=cut,
                    trunk=cached,
                )
            logits, mask, hidden = scored.scores, scored.mask, scored.prompt_hidden
            kept = scored.trunk
        else:
            self._check_action_candidates(prompts, candidates)
            with self._autocast():
                hidden, kept = prompt_states(
                    self.model, self.tokenizer, prompts, trunk_cut=cut, trunk=cached
                )
            logits = self.action_heads(hidden)
            mask = torch.ones_like(logits, dtype=torch.bool)
        if cfg.value_from_base:
            if trunk is not None:  # the base's state is a fixed function of the prompt too
                hidden = torch.stack([states.base_hidden for states in trunk]).to(hidden.device)
            else:
                with torch.no_grad(), self.model.disable_adapter(), self._autocast():
                    hidden = prompt_hidden_states(self.model, self.tokenizer, prompts)
        logits = logits.float() / cfg.temperature  # -inf (absent candidates) stays -inf
        kept_trunk = None
        if kept is not None:
            bases = hidden.detach() if cfg.value_from_base else [None] * len(kept)
            kept_trunk = [TrunkStates(h, b) for h, b in zip(kept, bases, strict=True)]
        if cfg.value_time and elapsed is None:
            elapsed = [0.0] * len(prompts)
        return PolicyOutput(
            logits=logits,
            values=self.value_head(
                hidden, None if elapsed is None else torch.tensor(elapsed, dtype=torch.float32)
            ),
            mask=mask,
            trunk=kept_trunk,
            features=hidden,
        )

    # ----------------------------------------------------------------------------------------
    # The frozen trunk (glam.trunk)
    # ----------------------------------------------------------------------------------------

    def trunk_cache_problem(self) -> str | None:
        """Why the update cannot run from the frozen trunk's cached states (`glam.trunk`), or
        None when it can: LoRA adapts only the top layers (a decoder-only model), or only the
        decoder (an encoder-decoder model), or a full fine-tuning trains only those
        (`model.trained_layers`), and nothing below them is trained."""
        base = unwrap_model(self.model)
        lora = isinstance(self.model, PeftModel)
        if not lora and all(p.requires_grad for p in base.parameters()):
            return (
                "the whole model is fine-tuned (model.lora.enabled=false): every layer changes "
                "with each step, so there is no frozen trunk to keep (model.trained_layers=K "
                "trains the top K layers only)"
            )
        key = "model.lora.layers" if lora else "model.trained_layers"
        if model_kind(base) == "encoder_decoder":
            if any(p.requires_grad for p in base.get_encoder().parameters()):
                return (
                    f"the encoder is trained: set {key} to train only the decoder's layers, and "
                    "the encoder's output is kept instead"
                )
            return None
        try:
            name, stack = layer_stack(base)
        except ValueError as error:
            return str(error)
        adapted = trainable_layers(stack)
        if not adapted or adapted[0] == 0:
            if not lora:
                return (
                    "model.trained_layers includes the lowest layer: nothing below it is "
                    "frozen; set model.trained_layers=K to train the top K layers"
                )
            return (
                "LoRA adapts the lowest layer (model.lora.layers=null adapts every layer): "
                "nothing below it is frozen; set model.lora.layers=K to adapt the top K layers"
            )
        above = tuple(f"{name}.{i}." for i in range(adapted[0], len(stack)))
        outside = sorted(
            n for n, p in base.named_parameters() if p.requires_grad and not n.startswith(above)
        )
        if outside:
            return (
                f"a parameter outside the adapted layers is trained ({outside[0]}): the cache "
                "needs everything but the top layers frozen"
            )
        return None

    def enable_trunk_cache(self) -> TrunkCut:
        """From now on, forwards keep the frozen trunk's states and take them back (`forward`).

        Raises:
            ValueError: the cache does not apply (`trunk_cache_problem` says why).
        """
        problem = self.trunk_cache_problem()
        if problem is not None:
            raise ValueError(problem)
        base = unwrap_model(self.model)
        if model_kind(base) == "encoder_decoder":
            self.trunk_cut = TrunkCut()
        else:
            _, stack = layer_stack(base)
            self.trunk_cut = TrunkCut(layers=stack, first=trainable_layers(stack)[0])
        return self.trunk_cut

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimiser should update (adapter or whole model, and the heads)."""
        return [p for p in self.parameters() if p.requires_grad]

    # ----------------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------------

    def save_pretrained(
        self,
        path: str | Path,
        *,
        include_base: bool | None = None,
        training_env: EnvConfig | Mapping[str, Any] | None = None,
    ) -> Path:
        """Write the policy to a folder; `LLMActorCritic.from_pretrained` reads it back.

        An adapter is saved in peft format under `adapter/` (`PeftModel.from_pretrained` loads
        it). The base weights are saved too (`base/`) unless they can be reloaded from
        `model_cfg.name_or_path`, i.e. unless `include_base` is False or, by default, the
        model is pretrained and named by a config. Without an adapter the whole model goes to
        `model/`. Heads go to `heads.safetensors`, configs to `glam_policy.json`, with the env
        the policy was trained on (`training_env`, by default `self.training_env`), so that a
        policy folder copied on its own is still evaluated with its prompt length and actions.
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
        model = asdict(self.model_cfg) if self.model_cfg else None
        if model is not None:
            # Whether model code may run is decided by whoever loads the folder, never by it.
            del model["trust_remote_code"]
        env = env_record(training_env) or self.training_env
        meta = {
            "format_version": FORMAT_VERSION,
            "weights": weights,
            "dtype": dtype,
            "model": model,
            "policy": asdict(self.policy_cfg),
            "action_words": self.action_words,
            "env": env,
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
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        trust_remote_code: bool = False,
        training_env: EnvConfig | Mapping[str, Any] | None = None,
    ) -> LLMActorCritic:
        """Restore a policy written by `save_pretrained` (adapter trainable, heads loaded).

        `trust_remote_code` is the caller's decision (the user's `model.trust_remote_code` when
        resuming, `agent.trust_remote_code` when evaluating), never the folder's: a checkpoint
        is data, and a model folder may name Python files beside it (`auto_map` in its
        `config.json`) that would run on load. Without it, a model of a type transformers knows
        loads with transformers' own code, and any other model is refused.

        `training_env` replaces the env recorded in the folder (a resumed run passes its own).

        Raises:
            CheckpointError: a file of the folder is missing, truncated or malformed (the message
                names it), or the model needs its own code and `trust_remote_code` is False.
            glam.ModelNotFoundError: an adapter-only folder whose base model cannot be found.
        """
        path = Path(path)
        meta = _read_meta(path / CONFIG_FILE)
        try:
            model_cfg = _model_config(meta["model"], trust_remote_code) if meta["model"] else None
            policy_cfg = PolicyConfig(**{**SETTINGS_BEFORE_THEIR_FIELD["policy"], **meta["policy"]})
        except (TypeError, ValueError, KeyError) as error:
            raise CheckpointError(f"{path / CONFIG_FILE}: malformed settings: {error}") from None
        weights, dtype = meta["weights"], meta["dtype"]
        if weights == "adapter" and model_cfg is None:
            raise CheckpointError(
                f"{path / CONFIG_FILE}: weights='adapter' but no model settings name the base"
            )
        _check_files(path, weights)
        if weights == "full":
            model, tokenizer = _load_saved_model(path / "model", dtype, trust_remote_code)
            if model_cfg is None or model_cfg.disable_dropout:
                disable_dropout(model)
            if model_cfg is not None and model_cfg.trained_layers is not None:
                train_only_layers(model, model_cfg.trained_layers)
        else:
            if weights == "adapter+base":
                base, tokenizer = _load_saved_model(path / "base", dtype, trust_remote_code)
            else:
                base, tokenizer = _load_model_explained(
                    model_cfg.name_or_path,
                    dtype,
                    trust_remote_code,
                    f"base model {model_cfg.name_or_path!r} of {path}",
                )
            if model_cfg.disable_dropout:
                disable_dropout(base)
            try:
                with quiet_peft():
                    model = PeftModel.from_pretrained(base, path / "adapter", is_trainable=True)
            except (OSError, ValueError, RuntimeError, KeyError) as error:
                raise CheckpointError(
                    f"{path / 'adapter'}: the LoRA adapter does not load onto its base model: "
                    f"{error}"
                ) from error
        if model_cfg and model_cfg.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        try:
            policy = cls(model, tokenizer, policy_cfg, meta["action_words"], model_cfg=model_cfg)
        except ValueError as error:
            raise CheckpointError(f"{path / CONFIG_FILE}: {error}") from None
        policy.training_env = env_record(training_env) or meta.get("env")
        _load_heads(policy, path / HEADS_FILE)
        return policy

    def start_from(self, path: str | Path, *, trust_remote_code: bool = False) -> None:
        """Take the acting weights of the policy saved in `path` (`save_pretrained`): the model
        (adapter and base, or the whole model) and the action heads; the value head stays this
        policy's own, untrained. A warm start of PPO from a clone (`train.init_policy`), for
        every head and model kind: an adapter alone is `model.lora.init`.

        The saved policy must act as this one would with its weights: the same actions, head,
        temperature, score normalisation and prompt format, the same kind of weights (adapter or
        whole model) on a model pretrained or not alike.

        Raises:
            CheckpointError: a file of the folder is missing, truncated or malformed.
            ValueError: the saved policy is another kind of policy (the message lists how), or
                its weights are shaped otherwise.
        """
        path = Path(path)
        meta = _read_meta(path / CONFIG_FILE)
        saved_policy = {**SETTINGS_BEFORE_THEIR_FIELD["policy"], **meta["policy"]}
        ours = asdict(self.policy_cfg)
        differences = [
            f"policy.{key}={saved_policy.get(key)!r} there, {ours[key]!r} here"
            for key in ("head", "temperature", "normalization", "prompt_format")
            if saved_policy.get(key) != ours[key]
        ]
        if meta["action_words"] != self.action_words:
            differences.append(f"actions {meta['action_words']} there, {self.action_words} here")
        kinds = {True: "a LoRA adapter", False: "the whole model"}
        adapter_there, adapter_here = meta["weights"] != "full", isinstance(self.model, PeftModel)
        if adapter_there != adapter_here:
            differences.append(f"{kinds[adapter_there]} there, {kinds[adapter_here]} here")
        pretrained = (meta["model"] or {}).get("pretrained", True)
        if self.model_cfg is not None and pretrained != self.model_cfg.pretrained:
            differences.append(
                f"model.pretrained={pretrained} there, {self.model_cfg.pretrained} here"
            )
        if differences:
            raise ValueError(f"{path} holds another kind of policy: {'; '.join(differences)}")
        saved = LLMActorCritic.from_pretrained(path, trust_remote_code=trust_remote_code)
        try:
            self.model.load_state_dict(saved.model.state_dict())
            if self.action_heads is not None:
                self.action_heads.load_state_dict(saved.action_heads.state_dict())
        except RuntimeError as error:  # missing or unexpected keys, other shapes
            first = str(error).strip().splitlines()[0]
            raise ValueError(
                f"{path}: its weights do not fit this policy's model: {first}"
            ) from None


WEIGHTS_KINDS = ("full", "adapter", "adapter+base")
"""What a policy folder holds: the whole model (`model/`), a LoRA adapter on a base named by the
model settings (`adapter/`), or the adapter and its base (`adapter/`, `base/`)."""


def _read_meta(file: Path) -> dict:
    """`glam_policy.json`, checked for the keys and types `from_pretrained` relies on."""
    meta = read_policy_config(file.parent)
    expected = {
        "weights": str,
        "dtype": str,
        "model": (dict, type(None)),
        "policy": dict,
        "action_words": list,
    }
    for key, types in expected.items():
        if key not in meta:
            raise CheckpointError(f"{file}: missing key {key!r}")
        if not isinstance(meta[key], types):
            raise CheckpointError(f"{file}: {key!r} has the wrong type ({meta[key]!r})")
    if meta["weights"] not in WEIGHTS_KINDS:
        raise CheckpointError(f"{file}: weights={meta['weights']!r} is not one of {WEIGHTS_KINDS}")
    if meta["dtype"] not in DTYPES:
        raise CheckpointError(f"{file}: dtype={meta['dtype']!r} is not one of {sorted(DTYPES)}")
    if not all(isinstance(word, str) for word in meta["action_words"]):
        raise CheckpointError(f"{file}: action_words must be strings ({meta['action_words']!r})")
    check_env_record(file, meta)
    return meta


def _check_files(path: Path, weights: str) -> None:
    """Every file `weights` needs is there and whole, before a library reads it: a truncated
    or garbage file is reported by name, not as a library's traceback."""
    check_safetensors(path / HEADS_FILE)
    if weights != "full":
        _check_json(path / "adapter" / "adapter_config.json")
        check_safetensors(path / "adapter" / "adapter_model.safetensors")
    for folder in {"full": ["model"], "adapter+base": ["base"]}.get(weights, []):
        _check_model_folder(path / folder)


def _check_model_folder(folder: Path) -> None:
    """A Hugging Face model folder: valid JSON files, and whole safetensors weights (pickled
    weights are never loaded from a checkpoint)."""
    for file in [folder / "config.json", *sorted(folder.glob("*.json"))]:
        _check_json(file)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no 'weight_map' naming the weight files")
        for name in sorted(set(weight_map.values())):
            check_safetensors(folder / name)
    else:
        check_safetensors(folder / "model.safetensors")


def _check_json(file: Path) -> None:
    if not file.is_file():
        raise CheckpointError(f"{file}: file is missing")
    try:
        json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{file}: not valid JSON ({error})") from None


def _load_saved_model(
    folder: Path, dtype: str, trust_remote_code: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        return _load_model_explained(str(folder), dtype, trust_remote_code, str(folder))
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(f"{folder}: the saved model does not load: {error}") from error


def _load_model_explained(
    spec: str, dtype: str, trust_remote_code: bool, where: str
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`load_model`, with transformers' refusal of model code told in glam's terms."""
    try:
        return load_model(spec, dtype=dtype, trust_remote_code=trust_remote_code)
    except ValueError as error:
        if trust_remote_code or "trust_remote_code" not in str(error):
            raise
        raise CheckpointError(
            f"{where}: the model needs its own Python code (its config.json names it in "
            "'auto_map'), which does not run unless you allow it: pass trust_remote_code=True "
            "to LLMActorCritic.from_pretrained (model.trust_remote_code=true to resume "
            "training, agent.trust_remote_code=true to evaluate). Allow it only for a "
            "checkpoint whose code you trust."
        ) from None


def _load_heads(policy: LLMActorCritic, file: Path) -> None:
    try:
        heads = load_file(file)
        policy.value_head.load_state_dict(_with_prefix(heads, "value_head."))
        if policy.action_heads is not None:
            policy.action_heads.load_state_dict(_with_prefix(heads, "action_heads."))
    except (SafetensorError, RuntimeError) as error:  # RuntimeError: missing keys, shapes
        raise CheckpointError(f"{file}: the heads do not load: {error}") from None


def _with_prefix(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


def _model_config(data: dict, trust_remote_code: bool) -> ModelConfig:
    # A `trust_remote_code` recorded by older versions is dropped: the caller decides.
    return ModelConfig(
        **{
            **SETTINGS_BEFORE_THEIR_FIELD["model"],
            **data,
            "lora": AdapterConfig(**data["lora"]),
            "trust_remote_code": trust_remote_code,
        }
    )
