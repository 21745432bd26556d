"""Tiny random language models and a tiny tokenizer, built locally, for mechanics tests.

Nothing here downloads anything: the tokenizer is a byte-level BPE trained in a few
milliseconds on BabyAI-Text-like sentences (any text still tokenises, byte by byte at worst), and
the models are drawn from a config with a fixed seed. Import from any test:

    from helpers_tiny import one_torch_thread, tiny_causal_lm, tiny_seq2seq_lm, tiny_tokenizer

(`one_torch_thread` is an autouse fixture: importing it into a test module applies it there.)
The causal models are drawn with a large initialiser range (0.5) so that log-probabilities depend
strongly on the context: with the usual 0.02 a tiny model is almost uniform, and a test comparing
two scorers could not see an off-by-one position. (T5's own initialisation is already spread.)
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    T5Config,
    T5ForConditionalGeneration,
)

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3

ACTION_WORDS = ["turn left", "turn right", "go forward", "pick up", "drop", "toggle"]
"""BabyAI-Text's six actions, in minigrid's order."""

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
"""A ChatML-like template, so chat-prompt code can be tested on the tiny tokenizer."""

_CORPUS = [
    "Possible action of the agent: turn left, turn right, go forward, pick up, drop, toggle",
    "Goal of the agent: go to the red ball",
    "Goal of the agent: pick up the blue key, then go to the green box",
    "Goal of the agent: put the purple ball next to the yellow box",
    "Goal of the agent: open the grey door",
    "Observation 0: You see a wall 2 steps forward, You see a red ball 1 step left,",
    "Action 0: turn left",
    "Observation 1: You carry a blue key, You see a wall 1 step right,",
    "You see a closed yellow door 3 steps left and 2 steps forward,",
    "You see an open green door 1 step right and 4 steps forward,",
    "You see a locked purple door 2 steps forward",
    "Actions possibles de l'agent: tourner a gauche, tourner a droite, avancer",
    "But de l'agent: va a la balle rouge",
    "Tu vois un mur a 2 pas devant, Tu vois une boite verte a 3 pas a gauche",
    "rotate left, rotate right, move ahead, take, release, switch, sleep, do nothing, think",
    "user assistant system Reply with the next action of the agent only.",
]


GEMMA3_WINDOW = 8
"""The tiny Gemma 3's sliding window: shorter than every GLAM prompt, so that it matters."""


@functools.cache
def _trained_bpe_json(vocab_size: int) -> str:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    # Byte-level like GPT-2 / Llama-3 / SmolLM: a word carries its leading space ("Ġturn"), which is
    # what makes the scorer's boundary handling matter.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tokenizer.to_str()


def tiny_tokenizer(
    *, add_bos: bool = False, add_eos: bool = False, vocab_size: int = 400
) -> PreTrainedTokenizerFast:
    """A fresh byte-level BPE tokenizer (pad 0, bos 1, eos 2, unk 3) with a chat template.

    `add_bos` prepends `<s>` like Llama tokenizers; `add_eos` appends `</s>` like T5's. Each call
    returns a new object, so a test may change `padding_side` freely.
    """
    backend = Tokenizer.from_str(_trained_bpe_json(vocab_size))
    template = " ".join(([BOS] if add_bos else []) + ["$A"] + ([EOS] if add_eos else []))
    backend.post_processor = processors.TemplateProcessing(
        single=template,
        special_tokens=[(BOS, backend.token_to_id(BOS)), (EOS, backend.token_to_id(EOS))],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    """Run a test module on one torch thread (import this fixture into the module to apply it).

    Tiny models gain nothing from threads, and on a shared 2-core machine two threads that
    spin-wait on each other made tiny forwards 10-50x slower than one.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _seeded(build, seed: int) -> PreTrainedModel:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build()
    return model.eval()


def tiny_causal_lm(
    arch: str = "llama",
    *,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    tokenizer: PreTrainedTokenizerFast | None = None,
    num_layers: int = 2,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random causal LM (`llama`, with grouped-query attention, `gpt2`, or `gemma3`, whose
    layers but the top one attend within a window of `GEMMA3_WINDOW` positions; 2 layers unless
    `num_layers` says otherwise) + tokenizer.

    The Llama variant's tokenizer prepends a BOS token, the GPT-2 one does not, as the real ones.
    The model is in eval mode (no dropout) and fp32.
    """
    if arch in ("llama", "gemma3"):  # both tokenizers prepend <bos>
        tokenizer = tokenizer or tiny_tokenizer(add_bos=True)
        decoder = {
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": num_layers,
            "num_attention_heads": 4,
            "max_position_embeddings": 1024,
            "initializer_range": 0.5,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "attn_implementation": attn_implementation,
        }
    if arch == "llama":
        config = LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True, **decoder)
        build = functools.partial(LlamaForCausalLM, config)
    elif arch == "gpt2":
        tokenizer = tokenizer or tiny_tokenizer()
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=32,
            n_layer=num_layers,
            n_head=4,
            n_positions=1024,
            initializer_range=0.5,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            attn_implementation=attn_implementation,
        )
        build = functools.partial(GPT2LMHeadModel, config)
    elif arch == "gemma3":
        config = Gemma3TextConfig(
            num_key_value_heads=1,
            head_dim=8,
            sliding_window=GEMMA3_WINDOW,
            layer_types=["sliding_attention"] * (num_layers - 1) + ["full_attention"],
            **decoder,
        )
        build = functools.partial(Gemma3ForCausalLM, config)
    else:
        raise ValueError(
            f"unknown tiny causal architecture {arch!r}; use 'llama', 'gpt2' or 'gemma3'"
        )
    return _seeded(build, seed), tokenizer


def tiny_seq2seq_lm(
    arch: str = "t5",
    *,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    tokenizer: PreTrainedTokenizerFast | None = None,
    num_layers: int = 2,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A random T5 (relative position bias, untied head like Flan-T5; 2 encoder and 2 decoder
    layers unless `num_layers` says otherwise) + tokenizer.

    The tokenizer appends `</s>` to every text, as T5's does; the decoder starts from `<pad>`.
    `arch="bart"` gives a BART instead: learned absolute positions in the decoder (the case the
    packed decoder layout cannot serve), decoder starting from `</s>`.
    """
    tokenizer = tokenizer or tiny_tokenizer(add_eos=True)
    if arch == "bart":
        bart = BartConfig(
            vocab_size=len(tokenizer),
            d_model=32,
            encoder_layers=num_layers,
            decoder_layers=num_layers,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=1024,
            init_std=0.5,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.eos_token_id,
            forced_eos_token_id=None,
            attn_implementation=attn_implementation,
        )
        return _seeded(functools.partial(BartForConditionalGeneration, bart), seed), tokenizer
    if arch != "t5":
        raise ValueError(f"unknown tiny encoder-decoder architecture {arch!r}; use 't5' or 'bart'")
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_layers=num_layers,
        num_decoder_layers=num_layers,
        num_heads=4,
        relative_attention_num_buckets=8,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        attn_implementation=attn_implementation,
    )
    return _seeded(functools.partial(T5ForConditionalGeneration, config), seed), tokenizer


def save_tiny_model(folder: str | Path, arch: str = "llama", *, seed: int = 0) -> Path:
    """Write a tiny model and its tokenizer in Hugging Face layout; return the folder.

    `arch` is `llama`, `gpt2` or `t5`. The folder loads with `glam.load_model(str(folder))`.
    """
    folder = Path(folder)
    if arch == "t5":
        model, tokenizer = tiny_seq2seq_lm(seed=seed)
    else:
        model, tokenizer = tiny_causal_lm(arch, seed=seed)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
