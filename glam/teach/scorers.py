"""Log-likelihoods of candidate subgoals after a situation text: the LLM teacher's only question."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from glam.ask.config import AskConfig
from glam.llm.chat import ChatClientError
from glam.llm.remote import OpenAIEndpoint
from glam.models.loading import load_model
from glam.scoring import score_actions, separator
from glam.teach.config import TeachConfig

__all__ = [
    "PROBE_TEXT",
    "SCORING_DIALECTS",
    "LocalScorer",
    "OpenAIScorer",
    "SubgoalScorer",
    "build_scorer",
]


class SubgoalScorer(ABC):
    """`log P(candidate | prompt)` for each candidate of each prompt."""

    @abstractmethod
    def log_likelihoods(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        """One 1-D tensor per prompt, a log-likelihood per candidate."""

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release the model or the connections."""


class LocalScorer(SubgoalScorer):
    """A causal or encoder-decoder model in this process, scored by `glam.scoring` (one
    forward pass per batch of prompts, every candidate attending to its prompt).

    One prompt per forward on the CPU: on 2 CPU cores, SmolLM2-135M scored the teacher's
    situations (44-token prompts, 6.6 candidates) in 0.17 s each one by one, 0.27 s each in
    batches of 8 (padding costs more than batching saves on a CPU). On a GPU a forward of one
    short prompt leaves it idle: `load` puts the model there, `GPU_BATCH_SIZE` prompts a forward.
    """

    GPU_BATCH_SIZE = 8
    """Prompts per forward of `load` on a GPU (not measured yet: docs/gpu.md)."""

    def __init__(self, model: torch.nn.Module, tokenizer: object, *, batch_size: int = 1) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.no_grad()
    def log_likelihoods(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        scores: list[torch.Tensor] = []
        for start in range(0, len(prompts), self.batch_size):
            end = start + self.batch_size
            batch = score_actions(
                self.model,
                self.tokenizer,
                list(prompts[start:end]),
                [list(c) for c in candidates[start:end]],
            )
            scores.extend(score.float().cpu() for score in batch)
        return scores

    @classmethod
    def load(
        cls,
        spec: str,
        *,
        batch_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> LocalScorer:
        """The model `spec` names (embedded name, local folder, .gguf file or hub id), fp32, on
        `device`: by default this process's GPU where torch has one (an in-process teacher,
        annotator or planner of a GPU run, each rank on its own), else the CPU. `batch_size`
        None: `GPU_BATCH_SIZE` prompts a forward on a GPU, 1 on the CPU."""
        if device is None:
            cuda = torch.cuda.is_available()
            device = torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu"
        device = torch.device(device)
        if batch_size is None:
            batch_size = cls.GPU_BATCH_SIZE if device.type == "cuda" else 1
        model, tokenizer = load_model(spec)
        return cls(model.to(device), tokenizer, batch_size=batch_size)


SCORING_DIALECTS: tuple[str, ...] = ("echo_one", "echo", "prompt_logprobs", "forced")
"""How a server gives the log-probabilities of a text's own tokens, in the order they are tried:

- `echo_one`: `/v1/completions` with `echo=true, max_tokens=1, logprobs=1`: the text's tokens
  come back with their `token_logprobs` and `text_offset` (the one generated token, at or past
  the text's end, is left out): vLLM and OpenAI's legacy API;
- `echo`: the same with `max_tokens=0`: `scripts/serve_openai.py` (which generates nothing),
  vLLM in the versions that accept it;
- `prompt_logprobs`: vLLM's extension, `prompt_logprobs=0` with `max_tokens=1`: each prompt
  token's log-probability and decoded text, in `choices[i].prompt_logprobs`;
- `forced`: one request per token of the candidate, the token generated under a `logit_bias`
  of +100 with its log-probability before the bias (`max_tokens=1, logprobs=1`), the tokens
  from the server's `/extras/tokenize` and `/extras/detokenize`: llama-cpp-python, whose
  echoed log-probabilities are those of the next token (measured with 0.3.36: docs/oni.md).

An echo is accepted only when its log-probabilities belong to their own tokens: on a counting
text ("1, 2, 3, ...") the most probable alternative listed at each position must more often be
that position's token than the next one's (`_alignment`).
"""

PROBE_TEXT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20"
"""The text the first call scores to find a server's dialect (a model of any size predicts it,
which is what tells aligned log-probabilities from shifted ones)."""


class OpenAIScorer(SubgoalScorer):
    """Scores from an OpenAI-compatible server that gives the log-probabilities of a prompt's
    own tokens, in one of the dialects of `SCORING_DIALECTS` (found at the first call).

    Each (prompt, candidate) pair is sent as one text, the candidate joined to the prompt as
    `glam.scoring` joins them (one space unless the prompt ends in whitespace); the candidate's
    score is the sum of the log-probabilities of the tokens that start at or after the
    prompt's end (`text_offset`): the same tokens, and so the same number, as `LocalScorer`
    computes in-process with the same model. The texts of a call go in one request where the
    server takes a list of prompts, else one request each (llama-cpp-python takes one).

    A server that offers none of the dialects (llama.cpp's own `llama-server`, a chat-only
    server) stops the first call with a `ChatClientError` naming what each dialect got: scoring
    needs another server, while the chat clients (`/v1/chat/completions`) still work with it.
    """

    def __init__(
        self,
        base_url: str,
        model_id: str = "",
        *,
        timeout: float = 60.0,
        max_retries: int = 4,
        delay: float = 2.0,
        setting: str = "teach",
        dialect: str | None = None,
    ) -> None:
        """Connect (see `glam.llm.remote.OpenAIEndpoint`; errors name the `<setting>.*` keys);
        `dialect` one of `SCORING_DIALECTS` (then one request per text), or None: found at the
        first call, with whether the server takes a list of prompts.

        Raises:
            ChatClientError: the server cannot be reached or is not OpenAI-compatible.
        """
        if dialect is not None and dialect not in SCORING_DIALECTS:
            raise ValueError(f"dialect={dialect!r} is not one of {list(SCORING_DIALECTS)}")
        self.endpoint = OpenAIEndpoint(
            base_url,
            model_id=model_id,
            timeout=timeout,
            max_retries=max_retries,
            delay=delay,
            setting=setting,
        )
        self.dialect = dialect
        """The server's dialect (None until the first call finds it)."""
        self.batched = False
        """Whether the server takes a list of prompts in one request (found with `dialect`)."""
        self.refused: dict[str, str] = {}
        """Why each dialect tried before `dialect` was not used."""
        self._root = self.endpoint.base_url.removesuffix("/v1")

    def log_likelihoods(
        self, prompts: Sequence[str], candidates: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        starts = [len(p) for p, cands in zip(prompts, candidates, strict=True) for _ in cands]
        texts = [
            p + separator(p) + c
            for p, cands in zip(prompts, candidates, strict=True)
            for c in cands
        ]
        if not texts:
            return [torch.zeros(0) for _ in prompts]
        if self.dialect is None:
            self.dialect = self._detect()
        try:
            flat = self._scores(texts, starts)
        except ChatClientError as error:
            raise ChatClientError(f"{self.endpoint.base_url} ({self.dialect}): {error}") from None
        scores, at = [], 0
        for cands in candidates:
            scores.append(torch.tensor(flat[at : at + len(cands)], dtype=torch.float32))
            at += len(cands)
        return scores

    def close(self) -> None:
        self.endpoint.close()

    def _scores(self, texts: Sequence[str], starts: Sequence[int]) -> list[float]:
        """Each text's score from character `start` on, in the server's dialect."""
        if self.dialect == "forced":
            return [
                self._forced_score(text, start) for text, start in zip(texts, starts, strict=True)
            ]
        read = _prompt_logprobs_score if self.dialect == "prompt_logprobs" else _candidate_score
        choices = self._completions(texts, self._body(self.dialect, logprobs=0))
        return [
            read(choice, start, text)
            for choice, start, text in zip(choices, starts, texts, strict=True)
        ]

    # ---- the dialects ---------------------------------------------------------------------------

    def _body(self, dialect: str, *, logprobs: int) -> dict:
        body: dict = {"model": self.endpoint.model_id, "temperature": 0}
        if dialect in ("echo", "echo_one"):
            body |= {"echo": True, "logprobs": logprobs, "max_tokens": int(dialect == "echo_one")}
        elif dialect == "prompt_logprobs":
            body |= {"prompt_logprobs": logprobs, "max_tokens": 1}
        return body

    def _completions(self, texts: Sequence[str], body: dict) -> list[dict]:
        """One choice per text, in order: in one request where the server takes a list."""
        if self.batched and len(texts) > 1:
            answer = self.endpoint.post("/completions", body | {"prompt": list(texts)})
            return _choices(answer, len(texts))
        return [
            _choices(self.endpoint.post("/completions", body | {"prompt": text}), 1)[0]
            for text in texts
        ]

    def _detect(self) -> str:
        """The first dialect of `SCORING_DIALECTS` that the server speaks correctly (see the
        module's `SCORING_DIALECTS`); each probe is one try, without retries."""
        retries, self.endpoint.max_retries = self.endpoint.max_retries, 0
        try:
            for dialect in SCORING_DIALECTS:
                if dialect == "echo" and self.refused.get("echo_one", "").startswith("shifted"):
                    self.refused["echo"] = "not tried: the server's echo is shifted (echo_one)"
                    continue
                try:
                    problem = self._probe(dialect)
                except ChatClientError as error:
                    problem = str(error)
                if problem is None:
                    self.batched = dialect != "forced" and self._takes_lists(dialect)
                    return dialect
                self.refused[dialect] = problem
        finally:
            self.endpoint.max_retries = retries
        tried = "; ".join(f"{dialect}: {why}" for dialect, why in self.refused.items())
        raise ChatClientError(
            f"{self.endpoint.base_url} offers no prompt log-probabilities that this scorer can "
            f"use ({tried}). Scoring needs another server (vLLM, llama-cpp-python, "
            "scripts/serve_openai.py); the chat clients still work with this one."
        )

    def _takes_lists(self, dialect: str) -> bool:
        """Whether the server answers a list of two prompts with two choices (llama-cpp-python
        takes one prompt a request)."""
        body = self._body(dialect, logprobs=0) | {"prompt": [PROBE_TEXT, PROBE_TEXT[:20]]}
        try:
            _choices(self.endpoint.post("/completions", body), 2)
        except ChatClientError:
            return False
        return True

    def _probe(self, dialect: str) -> str | None:
        """None when the server speaks `dialect` correctly, else what is wrong."""
        if dialect == "forced":
            self._forced_score(PROBE_TEXT, PROBE_TEXT.index(" 20"))
            return None
        body = self._body(dialect, logprobs=1) | {"prompt": PROBE_TEXT}
        (choice,) = _choices(self.endpoint.post("/completions", body), 1)
        if dialect == "prompt_logprobs":
            _prompt_logprobs_score(choice, PROBE_TEXT.index(" 20"), PROBE_TEXT)
            return None
        _candidate_score(choice, PROBE_TEXT.index(" 20"), PROBE_TEXT)
        aligned, shifted = _alignment(choice)
        if shifted > aligned:
            return (
                f"shifted: the most probable alternative listed at a position is the next "
                f"token's ({shifted} positions) more often than its own ({aligned}): each "
                "log-probability belongs to the following token"
            )
        return None

    def _forced_score(self, text: str, start: int) -> float:
        """The candidate's tokens generated one by one under a logit bias (`forced`)."""
        whole = self._tokenize(text)
        prompt = self._tokenize(text[:start])
        common = next(
            (i for i, (a, b) in enumerate(zip(whole, prompt, strict=False)) if a != b),
            min(len(whole), len(prompt)),
        )
        if common == len(whole):
            raise ChatClientError(f"no token of {text!r} after its prompt")
        prefix = self._post_root("/extras/detokenize", {"tokens": whole[:common]})["text"]
        total = 0.0
        for token in whole[common:]:
            body = {
                "model": self.endpoint.model_id,
                "prompt": prefix,
                "max_tokens": 1,
                "logprobs": 1,
                "temperature": 0,
                "logit_bias": {str(token): 100.0},
            }
            (choice,) = _choices(self.endpoint.post("/completions", body), 1)
            values = (choice.get("logprobs") or {}).get("token_logprobs")
            if not isinstance(values, list) or not values or values[0] is None:
                raise ChatClientError("/completions answered a forced token without logprobs")
            total += _log_probability(values[0], "logprobs.token_logprobs")
            prefix += choice.get("text", "")
        return total

    def _tokenize(self, text: str) -> list[int]:
        tokens = self._post_root("/extras/tokenize", {"input": text}).get("tokens")
        if not isinstance(tokens, list):
            raise ChatClientError("/extras/tokenize answered no `tokens` list")
        return [int(token) for token in tokens]

    def _post_root(self, path: str, payload: dict) -> dict:
        answer = self.endpoint.post(self._root + path, payload)
        if not isinstance(answer, dict):
            raise ChatClientError(f"{path} answered no JSON object")
        return answer


def build_scorer(cfg: TeachConfig | AskConfig, setting: str) -> SubgoalScorer:
    """The scorer a config section names: `cfg.backend` `local` loads `cfg.model` in this
    process, `openai` connects to `cfg.base_url` (errors name the `<setting>.*` keys)."""
    if cfg.backend == "openai":
        return OpenAIScorer(
            cfg.base_url,
            cfg.model_id,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            setting=setting,
        )
    return LocalScorer.load(cfg.model)


def _choices(body: object, count: int) -> list[dict]:
    """The answer's choices in prompt order, checked to be `count` echoes with logprobs."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or len(choices) != count:
        raise ChatClientError(
            f"/completions answered {len(choices) if isinstance(choices, list) else 'no'} "
            f"choices for {count} prompts: the server does not score echoed prompts"
        )
    return sorted(choices, key=lambda choice: choice.get("index", 0))


def _candidate_score(choice: dict, start: int, text: str) -> float:
    """Sum of the echoed log-probabilities of the text's tokens from character `start` on
    (a generated token, at or past the text's end, is not the text's)."""
    logprobs = choice.get("logprobs") or {}
    offsets, values = logprobs.get("text_offset"), logprobs.get("token_logprobs")
    if not isinstance(offsets, list) or not isinstance(values, list) or not values:
        raise ChatClientError(
            "/completions answered without logprobs.text_offset and token_logprobs: the server "
            "does not echo prompt log-probabilities (vLLM and scripts/serve_openai.py do)"
        )
    picked = [v for offset, v in zip(offsets, values, strict=False) if start <= offset < len(text)]
    if not picked or any(v is None for v in picked):
        raise ChatClientError(f"no scored token after the prompt in {text!r}")
    return sum(_log_probability(v, "logprobs.token_logprobs") for v in picked)


def _prompt_logprobs_score(choice: dict, start: int, text: str) -> float:
    """Sum of vLLM's `prompt_logprobs` of the text's tokens from character `start` on.

    Each entry holds the prompt token's own log-probability and decoded text (one entry per
    position with `prompt_logprobs=0`; the first position's is null). The tokens' places are
    counted back from the text's end, so a BOS token at the start does not shift them.
    """
    entries = choice.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) < 2:
        raise ChatClientError(
            "/completions answered without a `prompt_logprobs` list: the server does not speak "
            "vLLM's prompt_logprobs"
        )
    total, end, picked = 0.0, len(text), 0
    for entry in reversed(entries):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise ChatClientError(
                "a prompt_logprobs entry is not one token's {id: {logprob, decoded_token}}"
            )
        (info,) = entry.values()
        token = info.get("decoded_token") if isinstance(info, dict) else None
        if not isinstance(token, str) or "logprob" not in info:
            raise ChatClientError("a prompt_logprobs entry has no logprob and decoded_token")
        end -= len(token)
        if end < start:
            break
        total += _log_probability(info["logprob"], "prompt_logprobs[].logprob")
        picked += 1
        if end == start:
            break
    if not picked:
        raise ChatClientError(f"no scored token after the prompt in {text!r}")
    return total


def _log_probability(value: object, field: str) -> float:
    """`value` of the answer's `field` as a log-probability: a finite number.

    Raises:
        ChatClientError: a string, a boolean, NaN or an infinity, naming the field.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ChatClientError(
            f"/completions answered {field} = {value!r}: a log-probability must be a finite "
            "number (the server's scores cannot be used)"
        )
    return float(value)


def _alignment(choice: dict) -> tuple[int, int]:
    """(positions whose most probable listed alternative is their own token, positions where
    it is the next token): an echo whose log-probabilities are shifted by one token scores
    more of the second on a predictable text. (0, 0) when the server lists no alternatives."""
    logprobs = choice.get("logprobs") or {}
    tokens, tops = logprobs.get("tokens"), logprobs.get("top_logprobs")
    if not isinstance(tokens, list) or not isinstance(tops, list):
        return 0, 0
    aligned = shifted = 0
    for i, top in enumerate(tops):
        if not isinstance(top, dict) or not top:
            continue
        best = max(top, key=top.get)
        aligned += best == tokens[i]
        shifted += i + 1 < len(tokens) and best == tokens[i + 1]
    return aligned, shifted
