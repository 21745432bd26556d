"""A language model that writes its action: the actor-critic of `policy.kind=generate`.

The scoring policy (`glam.policy.llm_policy`) reads a fixed list of action strings and takes a
softmax over their likelihoods; this one samples an answer after the prompt, as an agent does
in RAGEN, verl-agent or BALROG, and the env plays the action the answer names:

- **Writing** (the rollout, `forward(prompts)`): answers are drawn token by token from
  `softmax(logits / generate.temperature)` (`glam.decoding`), up to
  `generate.max_new_tokens`, ending at the end-of-text token (or a newline, for an `action`
  answer). Each is read into an action (`read_answer`): the whole answer, normalised, must be
  an action word (`generate.answer=action`), or the text after its last "ACTION:" must be
  (`think`, BALROG's chain-of-thought reading). An invalid answer gets index
  `len(action_words)`: the env runner plays it as `generate.invalid_action`.
- **Scoring** (the update, `forward(prompts, answers)`): the same answers teacher-forced, with
  gradients. The action's log-probability is the sum of its answer's token log-probabilities
  (turn-level PPO); the token log-probabilities themselves serve GRPO's token-level ratio and
  its KL penalty (`glam.ppo.algorithms`).
- **Value**: the value head on the prompt's last token, as the scoring policy's; none (zeros,
  the head frozen) when the algorithm has no critic (GRPO, GiGPO).

The answers travel with the transitions (`WrittenObservations.answers`): the tokens, their
log-probabilities under the sampling distribution (the old log-probabilities of PPO's ratio), and
under the reference model (the base model with the LoRA adapter switched off) when the algorithm
has a KL penalty. The keys and values of each env's last turn are kept for its next one
(`generate.kv_cache`, `glam.decoding.TurnCache`), and dropped whenever the policy goes into
training mode: an update changes the weights they were computed with.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from peft import PeftModel
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

from glam.config import EnvConfig, ModelConfig, PolicyConfig
from glam.decoding import (
    AnswerConstraint,
    AnswerTrie,
    ThoughtThenAnswer,
    TurnCache,
    answer_spans,
    sample_answers,
    score_answers,
)
from glam.models.loading import load_model
from glam.policy.balrog import THINK_MARKER, last_action
from glam.policy.files import CONFIG_FILE, CheckpointError, env_record
from glam.policy.generation_config import GenerationConfig
from glam.policy.llm_policy import LLMActorCritic
from glam.policy.output import PolicyOutput
from glam.ppo.algorithm_config import AlgorithmConfig
from glam.scoring import model_kind, unwrap_model
from glam.trunk import TrunkStates, keep_layer_input

__all__ = [
    "AnswerDistribution",
    "Answers",
    "WritingActorCritic",
    "WrittenObservations",
    "WrittenOutput",
    "answer_line",
    "normalize_answer",
    "read_answer",
]

_PUNCTUATION = ".,;:!?\"'`*_()[]<>"
"""Stripped from both ends of an answer: "Turn left." and "**turn left**" name "turn left"."""


def answer_line(text: str) -> str:
    """What GLAM's prompt history keeps of an invalid answer: its first line, spaces collapsed."""
    return " ".join(text.strip().split("\n", 1)[0].split())


def normalize_answer(text: str) -> str:
    """Lower case, runs of whitespace (newlines too) as one space, surrounding punctuation off."""
    return " ".join(text.lower().split()).strip(_PUNCTUATION + " ")


def read_answer(text: str, action_words: Sequence[str], answer: str = "action") -> int | None:
    """The index of the action `text` names, or None when it names none.

    `answer="action"`: the whole text, normalised, is an action word ("Turn left." is "turn
    left"; "turn left, then go forward" is none). `answer="think"`: what follows the text's last
    "ACTION:", read as BALROG reads its chain-of-thought agent (`glam.policy.balrog.last_action`),
    then normalised.
    """
    if answer == "think":
        text = last_action(text)
    words = {normalize_answer(word): i for i, word in enumerate(action_words)}
    return words.get(normalize_answer(text))


@dataclass
class Answers:
    """What a writing policy wrote for a batch of prompts; kept with the transitions."""

    tokens: Tensor
    """`(B, T)` long: each answer's tokens (its stop token included), then padding."""
    lengths: Tensor
    """`(B,)` tokens of each answer."""
    logprobs: Tensor
    """`(B, T)` float32: each token's log-probability under the sampling distribution (the
    rollout's: PPO's old log-probabilities), 0 after the answer."""
    actions: Tensor
    """`(B,)` long: the action each answer names; `len(action_words)` for an invalid one."""
    texts: list[str]
    """The answers as written: decoded without special tokens, and an `action` answer up to its
    first newline."""
    entropy: Tensor
    """`(B,)` float32: the mean entropy of the distributions its tokens were drawn from."""
    stopped: Tensor
    """`(B,)` bool: the answer ended by itself (False: cut at `generate.max_new_tokens`)."""
    ref_logprobs: Tensor | None = None
    """`(B, T)` float32: each token's log-probability under the reference model (the adapter
    off), for the KL penalty; None without one."""

    invalid_index: int = 0
    """The index invalid answers get (the number of action words)."""

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def valid(self) -> Tensor:
        """`(B,)` bool: the answer named an action."""
        return self.actions < self.invalid_index

    def select(self, positions: Sequence[int]) -> Answers:
        """The answers at `positions`, in that order."""
        index = torch.as_tensor(list(positions), dtype=torch.long)
        return Answers(
            self.tokens[index],
            self.lengths[index],
            self.logprobs[index],
            self.actions[index],
            [self.texts[i] for i in positions],
            self.entropy[index],
            self.stopped[index],
            None if self.ref_logprobs is None else self.ref_logprobs[index],
            self.invalid_index,
        )

    @classmethod
    def cat(cls, parts: Sequence[Answers]) -> Answers:
        """The parts one after the other, padded to the longest answer."""
        width = max(part.tokens.shape[1] for part in parts)

        def padded(tensors: list[Tensor], value: float) -> Tensor:
            return torch.cat(
                [nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors]
            )

        refs = [part.ref_logprobs for part in parts]
        return cls(  # the padding is masked by `lengths` wherever tokens are read
            padded([part.tokens for part in parts], 0),
            torch.cat([part.lengths for part in parts]),
            padded([part.logprobs for part in parts], 0.0),
            torch.cat([part.actions for part in parts]),
            [text for part in parts for text in part.texts],
            torch.cat([part.entropy for part in parts]),
            torch.cat([part.stopped for part in parts]),
            None if any(r is None for r in refs) else padded(refs, 0.0),  # type: ignore[arg-type]
            parts[0].invalid_index,
        )

    @property
    def token_mask(self) -> Tensor:
        """`(B, T)` bool: the answer's own tokens."""
        return torch.arange(self.tokens.shape[1]) < self.lengths[:, None]


@dataclass
class WrittenObservations:
    """What a writing policy reads: one prompt per env, and once it has written, its answers.

    `states` are the envs' current observations alone (mission and what the agent sees, without
    the history or any feedback): GiGPO's anchor states (`glam.ppo.algorithms`).
    """

    prompts: list[str]
    answers: Answers | None = None
    states: list[str] | None = None
    trunk: list[TrunkStates] | None = None
    """What the frozen trunk computed for each prompt and its answer (`glam.trunk`): the
    update runs the adapted layers from it; None without the cache."""

    kind = "written"

    def __len__(self) -> int:
        return len(self.prompts)

    def select(self, positions: Sequence[int]) -> WrittenObservations:
        positions = list(positions)
        return WrittenObservations(
            [self.prompts[i] for i in positions],
            None if self.answers is None else self.answers.select(positions),
            None if self.states is None else [self.states[i] for i in positions],
            None if self.trunk is None else [self.trunk[i] for i in positions],
        )

    @classmethod
    def cat(cls, parts: Sequence[WrittenObservations]) -> WrittenObservations:
        answers = [part.answers for part in parts]
        states = [part.states for part in parts]
        trunks = [part.trunk for part in parts]
        return cls(
            [p for part in parts for p in part.prompts],
            None if any(a is None for a in answers) else Answers.cat(answers),  # type: ignore[arg-type]
            None if any(s is None for s in states) else [s for part in states for s in part],  # type: ignore[union-attr]
            None if any(t is None for t in trunks) else [s for part in trunks for s in part],  # type: ignore[union-attr]
        )

    def with_answers(self, answers: Answers) -> WrittenObservations:
        """The same observations carrying the answers written after them."""
        if len(answers) != len(self.prompts):
            raise ValueError(f"{len(answers)} answers for {len(self.prompts)} prompts")
        return WrittenObservations(self.prompts, answers, self.states, self.trunk)

    def with_trunk(self, trunk: list[TrunkStates] | None) -> WrittenObservations:
        """The same observations carrying `trunk` (one per prompt and its answer)."""
        if trunk is not None and len(trunk) != len(self.prompts):
            raise ValueError(f"{len(trunk)} trunk states for {len(self.prompts)} prompts")
        return WrittenObservations(self.prompts, self.answers, self.states, trunk)

    @property
    def trunk_nbytes(self) -> int:
        """Bytes the trunk states take (0 without them)."""
        return sum(states.nbytes for states in self.trunk or ())

    def inputs(self) -> dict[str, Any]:
        """The policy's keyword arguments (`WritingActorCritic.forward`)."""
        inputs: dict[str, Any] = {"prompts": self.prompts, "answers": self.answers}
        if self.trunk is not None:
            inputs["trunk"] = self.trunk
        return inputs


class AnswerDistribution:
    """The trainer's view of a writing policy's choice: the action is the answer.

    `log_prob` is the answer's log-probability (the sum over its tokens), whatever index the env
    read it as; `entropy` the mean entropy of its tokens' distributions; `sample` the actions the
    answers named (they were drawn in the forward).
    """

    def __init__(
        self, token_logprobs: Tensor, token_entropy: Tensor, token_mask: Tensor, actions: Tensor
    ) -> None:
        self.token_logprobs = token_logprobs
        self.token_entropy = token_entropy
        self.token_mask = token_mask
        self.actions = actions

    def sample(self) -> Tensor:
        return self.actions

    def log_prob(self, actions: Tensor) -> Tensor:
        if actions.shape != self.actions.shape or not torch.equal(
            actions.to(self.actions.device), self.actions
        ):
            raise ValueError(
                "a writing policy's log-probability is that of the answer it wrote: `actions` "
                "must be the actions its answers named"
            )
        return (self.token_logprobs * self.token_mask).sum(-1)

    def entropy(self) -> Tensor:
        counts = self.token_mask.sum(-1).clamp(min=1)
        return (self.token_entropy * self.token_mask).sum(-1) / counts


@dataclass
class WrittenOutput(PolicyOutput):
    """`PolicyOutput` of a writing policy. `logits` `(B, 1)` hold each answer's log-probability
    (one "candidate" per prompt, so the trainer's finiteness check reads it)."""

    answers: Answers | None = None
    """The answers written in this forward (the rollout's), None when they were scored."""
    token_logprobs: Tensor | None = None
    """`(B, T)` each answer token's log-probability (with gradients in the update)."""
    token_entropy: Tensor | None = None
    """`(B, T)` the entropy of each answer token's distribution."""
    token_mask: Tensor | None = None
    """`(B, T)` bool: the answers' own tokens."""
    actions: Tensor | None = None
    """`(B,)` the actions the answers named."""

    @property
    def dist(self) -> AnswerDistribution:  # type: ignore[override]
        return AnswerDistribution(
            self.token_logprobs, self.token_entropy, self.token_mask, self.actions
        )

    def rows(self, n: int) -> WrittenOutput:
        return WrittenOutput(
            self.logits[:n],
            self.values[:n],
            self.mask[:n],
            answers=None if self.answers is None else self.answers.select(range(n)),
            token_logprobs=self.token_logprobs[:n],
            token_entropy=self.token_entropy[:n],
            token_mask=self.token_mask[:n],
            actions=self.actions[:n],
            trunk=None if self.trunk is None else self.trunk[:n],
        )


class WritingActorCritic(LLMActorCritic):
    """Actor-critic whose actor writes its action (the module docstring)."""

    observation_kind = "written"
    """The env runner builds `WrittenObservations` for it (`glam.ppo.written`)."""
    keeps_trunk_in_update = True
    """With the trunk cache on, its trunk depends on the answers as well as the prompts, so it is
    kept in the update's first pass, the recomputation of the old log-probabilities (which the
    trainer then always runs), not in the rollout, whose forwards read the prompts and one new
    token at a time."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        policy_cfg: PolicyConfig | None = None,
        action_words: Sequence[str] = (),
        *,
        model_cfg: ModelConfig | None = None,
        generation: GenerationConfig | None = None,
        value: bool = True,
        reference: bool = False,
    ) -> None:
        """
        Args:
            model, tokenizer, policy_cfg, action_words, model_cfg: as `LLMActorCritic`.
            generation: how answers are sampled and read (`generate.*`).
            value: compute the value head (False: values are 0 and the head is frozen, for an
                algorithm without a critic).
            reference: also keep each answer's log-probabilities under the base model with the
                adapter off (the KL penalty's reference); needs a LoRA adapter.
        """
        super().__init__(model, tokenizer, policy_cfg, action_words, model_cfg=model_cfg)
        if model_kind(unwrap_model(model)) != "causal":
            raise ValueError(
                "policy.kind=generate writes answers with a decoder-only (causal) model; "
                f"{type(unwrap_model(model)).__name__} is an encoder-decoder"
            )
        if reference and not isinstance(model, PeftModel):
            raise ValueError(
                "the KL penalty's reference is the base model with the LoRA adapter off, and this "
                "model has no adapter: enable model.lora or set algorithm.kl_coef=0"
            )
        self.generation = generation or GenerationConfig()
        self.uses_value = value
        self.reference = reference
        if not value:
            self.value_head.requires_grad_(False)
        self.turn_cache = TurnCache()
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self._stop: Tensor | None = None
        self._trie: tuple[GenerationConfig, AnswerConstraint] | None = None
        """The answer trie and the generation settings it was built for."""
        self._adds_eos: bool | None = None

    # ----------------------------------------------------------------------------------------
    # Construction
    # ----------------------------------------------------------------------------------------

    @classmethod
    def from_run_config(
        cls,
        model_cfg: ModelConfig,
        policy_cfg: PolicyConfig,
        generation: GenerationConfig,
        algorithm: AlgorithmConfig,
        action_words: Sequence[str],
        *,
        training_env: EnvConfig | Mapping[str, Any] | None = None,
        checkpoint: str | Path | None = None,
        trust_remote_code: bool = False,
    ) -> WritingActorCritic:
        """The writing policy of a run: freshly loaded, or restored from `checkpoint`."""
        value = algorithm.name == "ppo"
        reference = algorithm.name != "ppo" and algorithm.kl_coef > 0
        if checkpoint is not None:
            policy = cls.from_pretrained(
                checkpoint, trust_remote_code=trust_remote_code, training_env=training_env
            )
            policy.generation = generation
            policy._stop, policy._trie = None, None
            policy.set_algorithm(value=value, reference=reference)
            policy.answer_trie()  # a constraint the answers have no room for fails here
            return policy
        model, tokenizer = load_model(
            model_cfg.name_or_path,
            dtype=model_cfg.dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            pretrained=model_cfg.pretrained,
        )
        policy = cls.from_model(model, tokenizer, model_cfg, policy_cfg, action_words)
        policy.generation = generation
        policy.set_algorithm(value=value, reference=reference)
        policy.training_env = env_record(training_env)
        policy.answer_trie()  # a constraint the answers have no room for fails here
        return policy

    def set_algorithm(self, *, value: bool, reference: bool) -> None:
        """Whether the value head is computed and trained, and the reference log-probs kept."""
        if reference and not isinstance(self.model, PeftModel):
            raise ValueError(
                "the KL penalty's reference is the base model with the LoRA adapter off, and this "
                "model has no adapter: enable model.lora or set algorithm.kl_coef=0"
            )
        self.uses_value, self.reference = value, reference
        self.value_head.requires_grad_(value)

    # ----------------------------------------------------------------------------------------
    # Forward
    # ----------------------------------------------------------------------------------------

    def train(self, mode: bool = True) -> WritingActorCritic:
        """Also forget the kept keys and values: the weights are about to change."""
        self.turn_cache.clear()
        return super().train(mode)

    def forward(  # type: ignore[override]
        self,
        prompts: list[str],
        answers: Answers | None = None,
        candidates: object = None,
        trunk: object = None,
        *,
        greedy: bool = False,
    ) -> WrittenOutput:
        """Write an answer after each prompt (`answers` None, the rollout), or score the given
        answers teacher-forced (the update). `greedy` writes the likeliest token at each step
        (evaluation); its log-probabilities are still the sampling distribution's. `candidates`
        are the scoring policy's and must be None.

        Once `enable_trunk_cache` was called, scoring answers without `trunk` also returns the
        frozen trunk's states of each prompt and its answer (`WrittenOutput.trunk`), and scoring
        given them back as `trunk` runs only the adapted layers (`glam.trunk`)."""
        if candidates is not None:
            raise ValueError("a writing policy reads prompts (and its answers), not candidates")
        if trunk is not None and (self.trunk_cut is None or answers is None):
            raise ValueError(
                "trunk states are read back with the answers they were kept with, by a policy "
                "whose trunk cache is on"
            )
        ids = self._encode(prompts)
        if answers is None:
            return self._write(ids, greedy)
        return self._score(ids, answers, trunk)  # type: ignore[arg-type]

    def _write(self, ids: list[Tensor], greedy: bool = False) -> WrittenOutput:
        cfg = self.generation
        self.turn_cache.use_weights(self._adapter_on())  # `disable_adapter()` changes them
        with torch.no_grad(), self._autocast():
            sampled = sample_answers(
                self.model,
                ids,
                max_new_tokens=cfg.max_new_tokens,
                temperature=cfg.temperature,
                stop=self.stop_tokens(),
                pad_id=self.pad_id,
                cache=self.turn_cache if cfg.kv_cache else None,
                keep_going=_keep_going,
                greedy=greedy,
                allowed=self.answer_trie(),
            )
        invalid = len(self.action_words)
        texts = [
            self.tokenizer.decode(row[: int(n)], skip_special_tokens=True)
            for row, n in zip(sampled.tokens, sampled.lengths, strict=True)
        ]
        if cfg.answer == "action":  # a stop token may hold text before its newline: ".\n"
            texts = [text.split("\n", 1)[0] for text in texts]
        read = [read_answer(text, self.action_words, cfg.answer) for text in texts]
        actions = torch.tensor([invalid if i is None else i for i in read], dtype=torch.long)
        mask = torch.arange(sampled.tokens.shape[1]) < sampled.lengths[:, None]
        answers = Answers(
            tokens=sampled.tokens,
            lengths=sampled.lengths,
            logprobs=sampled.logprobs,
            actions=actions,
            texts=texts,
            entropy=(sampled.entropy * mask).sum(1) / sampled.lengths.clamp(min=1),
            stopped=sampled.stopped,
            ref_logprobs=self._reference_logprobs(ids, sampled.tokens, sampled.lengths),
            invalid_index=invalid,
        )
        device = sampled.prompt_hidden.device
        return WrittenOutput(
            logits=(sampled.logprobs * mask).sum(1, keepdim=True).to(device),
            values=self._values(sampled.prompt_hidden),
            mask=torch.ones((len(ids), 1), dtype=torch.bool, device=device),
            answers=answers,
            token_logprobs=sampled.logprobs.to(device),
            token_entropy=sampled.entropy.to(device),
            token_mask=mask.to(device),
            actions=actions.to(device),
        )

    def _score(
        self, ids: list[Tensor], answers: Answers, trunk: Sequence[TrunkStates] | None
    ) -> WrittenOutput:
        cut = self.trunk_cut
        keep = contextlib.nullcontext([])
        if cut is not None and trunk is None:
            keep = keep_layer_input(cut.layers, cut.first)
        with self._autocast(), keep as kept:
            logprobs, entropy, hidden = score_answers(
                self.model,
                ids,
                answers.tokens,
                answers.lengths,
                temperature=self.generation.temperature,
                pad_id=self.pad_id,
                cut=cut,
                trunk=None if trunk is None else [states.hidden for states in trunk],
                allowed=self.answer_trie(),
            )
        kept_trunk = None
        if kept:  # the update's first pass: keep the trunk for the passes after it
            spans = answer_spans(ids, answers.lengths)
            kept_trunk = [TrunkStates(kept[0][i, span]) for i, span in enumerate(spans)]
        mask = answers.token_mask.to(logprobs.device)
        return WrittenOutput(
            logits=logprobs.sum(1, keepdim=True),
            values=self._values(hidden),
            mask=torch.ones((len(ids), 1), dtype=torch.bool, device=logprobs.device),
            token_logprobs=logprobs,
            token_entropy=entropy,
            token_mask=mask,
            actions=answers.actions.to(logprobs.device),
            trunk=kept_trunk,
        )

    def _reference_logprobs(
        self, ids: list[Tensor], tokens: Tensor, lengths: Tensor
    ) -> Tensor | None:
        """The answers' token log-probabilities under the base model (adapter off)."""
        if not self.reference:
            return None
        with torch.no_grad(), self.model.disable_adapter(), self._autocast():
            logprobs, _, _ = score_answers(
                self.model,
                ids,
                tokens,
                lengths,
                temperature=self.generation.temperature,
                pad_id=self.pad_id,
                allowed=self.answer_trie(),
            )
        return logprobs.float().cpu()

    def _adapter_on(self) -> bool | None:
        """Whether the LoRA adapter is on now (False inside `model.disable_adapter()`); None
        without one."""
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                return not module.disable_adapters
        return None

    def _values(self, hidden: Tensor) -> Tensor:
        if not self.uses_value:
            return torch.zeros(hidden.shape[0], device=hidden.device)
        return self.value_head(hidden)

    def _encode(self, prompts: Sequence[str]) -> list[Tensor]:
        """Each prompt's token ids: a rendered chat template already holds its special tokens;
        an end-of-text token a tokenizer appends (T5-like) is dropped, the answer follows."""
        special = self.policy_cfg.prompt_format == "glam" or not self.tokenizer.chat_template
        encoded = self.tokenizer(list(prompts), add_special_tokens=special)["input_ids"]
        eos = self.tokenizer.eos_token_id
        return [
            torch.tensor(ids[:-1] if special and len(ids) > 1 and ids[-1] == eos else ids)
            for ids in encoded
        ]

    def stop_tokens(self) -> Tensor:
        """`(vocab,)` bool: the tokens that end an answer (end-of-text ones; for an `action`
        answer also every token that holds a newline)."""
        if self._stop is None:
            vocab = len(self.tokenizer)
            stop = torch.zeros(
                max(vocab, unwrap_model(self.model).config.vocab_size), dtype=torch.bool
            )
            eos = unwrap_model(self.model).generation_config.eos_token_id
            ids = {self.tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
            stop[[i for i in ids if i is not None]] = True
            if self.generation.answer == "action":
                texts = self.tokenizer.batch_decode([[i] for i in range(vocab)])
                stop[[i for i, text in enumerate(texts) if "\n" in text]] = True
            self._stop = stop
        return self._stop

    def answer_trie(self) -> AnswerConstraint | None:
        """With `generate.constrain=actions`, the answers that may be written: each action word's
        tokens, alone or after a space, then an end-of-text token or a token holding only a
        newline (one of `stop_tokens`); with `generate.answer=think`, a free thought before
        that, up to the tokens of "ACTION:" (`glam.decoding.ThoughtThenAnswer`). None: free
        writing.

        Raises:
            ValueError: `generate.max_new_tokens` leaves no room for the longest answer.
        """
        if self.generation.constrain != "actions":
            return None
        if self._trie is None or self._trie[0] != self.generation:
            self._stop = None  # the stop tokens follow `generate.answer` too
            encode = self.tokenizer
            answers = [
                encode(text, add_special_tokens=False)["input_ids"]
                for word in self.action_words
                for text in (word, f" {word}")
            ]
            stop = torch.nonzero(self.stop_tokens()).flatten().tolist()
            ends = [
                i for i in stop if not self.tokenizer.decode([i], skip_special_tokens=True).strip()
            ]
            trie = AnswerTrie(answers, ends)
            marker = []
            if self.generation.answer == "think":  # a free thought first, then "ACTION: <word>"
                marker = encode(THINK_MARKER, add_special_tokens=False)["input_ids"]
            room = len(marker) + trie.longest
            if room > self.generation.max_new_tokens:
                what = f'"{THINK_MARKER}" and the longest' if marker else "the longest"
                raise ValueError(
                    f"generate.constrain=actions: {what} action with its end takes {room} "
                    f"tokens, more than generate.max_new_tokens={self.generation.max_new_tokens}"
                )
            if marker:
                trie = ThoughtThenAnswer(marker, trie, self.generation.max_new_tokens, ends)
            self._trie = (self.generation, trie)
        return self._trie[1]

    def trunk_cache_problem(self) -> str | None:
        """As the scoring policy's: the trunk of a prompt and its answer is a fixed function of
        their tokens once LoRA adapts only the top layers (the writer is decoder-only)."""
        return super().trunk_cache_problem()

    # ----------------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path, **kwargs: Any) -> Path:  # type: ignore[override]
        """`LLMActorCritic.save_pretrained`, with the generation settings in glam_policy.json."""
        path = super().save_pretrained(path, **kwargs)
        meta = json.loads((path / CONFIG_FILE).read_text())
        meta["kind"] = "generate"  # `glam.baselines.loading.load_policy` builds this class
        meta["generation"] = asdict(self.generation)
        (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return path

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        trust_remote_code: bool = False,
        training_env: EnvConfig | Mapping[str, Any] | None = None,
    ) -> WritingActorCritic:
        """`LLMActorCritic.from_pretrained` (model code runs only with `trust_remote_code`), with
        the generation settings the folder records."""
        policy = super().from_pretrained(
            path, trust_remote_code=trust_remote_code, training_env=training_env
        )
        meta = json.loads((Path(path) / CONFIG_FILE).read_text())
        try:
            policy.generation = GenerationConfig(**meta.get("generation", {}))
        except (TypeError, ValueError) as error:
            raise CheckpointError(
                f"{Path(path) / CONFIG_FILE}: malformed generation: {error}"
            ) from None
        policy._stop, policy._trie = None, None
        return policy  # type: ignore[return-value]


def _keep_going(writing: bool) -> bool:
    """Whether any process still writes (each process runs as many forwards as the others)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return writing
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else "cpu"
    flag = torch.tensor([float(writing)], device=device)
    dist.all_reduce(flag)
    return bool(flag.item() > 0)
