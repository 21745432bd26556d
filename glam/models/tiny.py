"""Tiny random language models built on the fly, for tests, checks and learning experiments.

`prepare_tiny_model("tiny-random-llama", folder)` writes a Hugging Face model folder (config,
safetensors weights, tokenizer) without any download: a word-level tokenizer over the words
BabyAI-Text and the GLAM prompt use, and weights drawn from a fixed seed, so every machine builds
the same model. The folder name carries a hash of the spec, so changing a spec rebuilds it.

`tiny-random-llama` (2 layers, hidden 64, about 90k parameters) learns
`BabyAI-GoToRedBallNoDists-v0` with PPO in under a minute on two CPU cores. `tiny-random-gemma3`
has Gemma 3's architecture (a sliding-window layer under a global one, grouped-query attention
with one key-value head), for the mechanics of a second model family without its weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

from glam.models.specs import TINY_MODELS, TinyModelSpec

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<unk>", "<s>", "</s>")
_WORDS = """
possible action actions of the agent goal observation observations i would like to you have
user assistant system
turn left right go forward pick up drop toggle sleep do nothing think rotate move ahead take
release switch
see a an wall step steps and carry open closed locked door key ball box
red green blue purple yellow grey
put next then after
"""
VOCABULARY: tuple[str, ...] = (
    *_WORDS.split(),
    *":,.;'?!-()[]",
    *[str(n) for n in range(16)],
)
"""Words the tokenizer knows (lower case); anything else becomes `<unk>`."""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A lower-casing word-level tokenizer over `VOCABULARY` (punctuation split off words)."""
    words = list(dict.fromkeys(VOCABULARY))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *words])}
    tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )


def build_tiny_model(
    spec: TinyModelSpec, vocab_size: int
) -> LlamaForCausalLM | Gemma3ForCausalLM | T5ForConditionalGeneration:
    """The randomly initialised model of `spec` (same weights for the same spec)."""
    common = {"vocab_size": vocab_size, "pad_token_id": 0, "eos_token_id": 3}
    decoder = {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "max_position_embeddings": 1024,
        "initializer_range": spec.initializer_range,
        "bos_token_id": 2,
        **common,
    }
    if spec.architecture == "llama":
        config = LlamaConfig(
            num_key_value_heads=spec.num_heads, tie_word_embeddings=False, **decoder
        )
        model_class = LlamaForCausalLM
    elif spec.architecture == "gemma3":
        config = Gemma3TextConfig(
            num_key_value_heads=1,  # Gemma 3 270M's grouped-query attention
            head_dim=spec.hidden_size // spec.num_heads,
            sliding_window=spec.sliding_window,
            layer_types=["sliding_attention"] * (spec.num_layers - 1) + ["full_attention"],
            **decoder,
        )
        model_class = Gemma3ForCausalLM
    elif spec.architecture == "t5":
        config = T5Config(
            d_model=spec.hidden_size,
            d_ff=spec.intermediate_size,
            d_kv=spec.hidden_size // spec.num_heads,
            num_layers=spec.num_layers,
            num_heads=spec.num_heads,
            decoder_start_token_id=0,
            **common,
        )
        model_class = T5ForConditionalGeneration
    else:
        raise ValueError(f"unknown tiny architecture {spec.architecture!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        return model_class(config)


def prepare_tiny_model(name: str, models_dir: Path) -> Path:
    """Build the tiny model `name` into `models_dir` once (atomically); return its folder."""
    spec = TINY_MODELS[name]
    digest = hashlib.sha256(
        json.dumps([asdict(spec), SPECIAL_TOKENS, VOCABULARY]).encode()
    ).hexdigest()[:10]
    target = Path(models_dir) / f"{name}-{digest}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_tiny_model(spec, vocab_size=len(tokenizer))
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if not (tmp / "config.json").is_file() or not any(tmp.glob("*.safetensors")):
            raise RuntimeError(f"building the tiny model {name!r} wrote no weights into {tmp}")
        if target.exists() and not (target / "config.json").is_file():
            shutil.rmtree(target, ignore_errors=True)  # left incomplete by an older version
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
