"""Typed configuration of the chat clients and of the OpenAI-compatible server.

`ClientConfig` says which model answers and how: in-process (a Hugging Face model loaded here)
or behind any OpenAI-compatible HTTP endpoint (vLLM, llama.cpp's server, `scripts/serve_openai.py`),
with the sampling settings both share. `ServeConfig` is the root of `scripts/serve_openai.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlparse

from glam.config import DEFAULT_MODEL, hydra_schema

__all__ = ["BACKENDS", "ClientConfig", "ServeConfig"]

BACKENDS: tuple[str, ...] = ("local", "openai")
"""`local`: the model runs in this process; `openai`: an OpenAI-compatible HTTP endpoint."""


@dataclass
class ClientConfig:
    """The model that writes answers, and the sampling, time-out and retry settings."""

    backend: str = "local"
    """`local` (the agent's model, loaded in this process) or `openai` (an OpenAI-compatible
    server at `base_url`)."""
    base_url: str = "http://127.0.0.1:8080/v1"
    """`openai`: the endpoint's base URL, up to and including `/v1`."""
    model_id: str = ""
    """`openai`: the model name sent with each request; empty: the first model the server lists
    at `/v1/models`."""
    api_key_env: str = ""
    """`openai`: name of an environment variable holding the API key sent as a bearer token;
    empty: no key is sent (local servers need none)."""
    temperature: float | None = 1.0
    """Sampling temperature; 0 decodes greedily; None leaves the server's default (`local`:
    1). Sampling is from the whole distribution (no top-k or top-p cut) in-process and on
    `scripts/serve_openai.py`; other servers may add their own defaults."""
    max_tokens: int = 4096
    """Most tokens generated per answer (in-process, also capped by the model's context)."""
    timeout: float = 60.0
    """`openai`: seconds to wait for the connection and for each read of the answer."""
    max_retries: int = 4
    """`openai`: tries after the first failed one (connection refused, time-out, HTTP 429 or
    5xx); other HTTP errors fail at once."""
    delay: float = 2.0
    """`openai`: back-off before retry k (k = 1, 2...) is `delay * 2**(k-1)` seconds."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"client.backend={self.backend!r} is not one of {list(BACKENDS)}")
        url = urlparse(self.base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ValueError(
                f"client.base_url={self.base_url!r} is not an http(s) URL "
                "(e.g. http://127.0.0.1:8080/v1)"
            )
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"client.temperature must be >= 0 or null, got {self.temperature}")
        if self.max_tokens < 1:
            raise ValueError(f"client.max_tokens must be >= 1, got {self.max_tokens}")
        if not self.timeout > 0:
            raise ValueError(f"client.timeout must be > 0 seconds, got {self.timeout}")
        if self.max_retries < 0 or self.delay < 0:
            raise ValueError(
                f"client.max_retries and client.delay must be >= 0, got "
                f"{self.max_retries} and {self.delay}"
            )


@hydra_schema("serve_openai_schema")
@dataclass
class ServeConfig:
    """Root of `scripts/serve_openai.py`: which model to serve, where, and how."""

    model: str = DEFAULT_MODEL
    """Model spec: embedded name, local folder or .gguf file, or hub id."""
    model_id: str = ""
    """Name the server answers to and lists at `/v1/models`; empty: the model spec."""
    dtype: str = "float32"
    """Weights dtype: float32, bfloat16 or float16."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`..."""
    host: str = "127.0.0.1"
    """Address to listen on (the loopback address by default: reachable from this machine
    only)."""
    port: int = 8080
    """Port to listen on; 0 picks a free one (the URL is printed at start-up)."""
    max_tokens: int = 4096
    """Default `max_tokens` of a request that sets none."""
    torch_threads: int = 0
    """torch.set_num_threads; 0 keeps torch's default."""

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r} is not one of float32, bfloat16, float16")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_tokens < 1 or self.torch_threads < 0:
            raise ValueError("max_tokens must be >= 1 and torch_threads >= 0")
