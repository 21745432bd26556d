"""A small OpenAI-compatible HTTP server in front of the in-process chat client.

It serves `GET /v1/models` and `POST /v1/chat/completions` (no streaming, one choice) from a
`LocalChatClient`, one request at a time, with Python's standard `http.server`. Each request is
answered under its own `seed` exactly as the in-process client answers it with `batch_size=1`,
so a run through the server can be checked against an in-process one answer for answer.

`POST /v1/completions` scores texts, as vLLM does with `echo=true, max_tokens=0, logprobs=k`:
each prompt comes back with `logprobs.tokens`, `token_logprobs` (the first is null: nothing
predicts it), `text_offset` (each token's first character in the prompt) and `top_logprobs` (the
k most probable tokens at each position, and the actual one). This is how a remote teacher
scores candidate subgoals (`glam.teach.scorers.OpenAIScorer`). It only scores: a request that
asks it to generate (`max_tokens` > 0, or `echo` not true) is refused, and so is a model that is
not a causal language model.

It exists so that the HTTP path (`glam.llm.remote`) is tested against a real server on every
machine: llama.cpp's server (`llama-cpp-python`) has no prebuilt wheel for this platform and
takes many minutes to compile, and vLLM needs a GPU. For throughput, serve with vLLM.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import torch

from glam.llm.chat import ChatClientError, Message
from glam.llm.local import LocalChatClient
from glam.scoring import model_kind

__all__ = ["ChatServer", "RequestError"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 16 * 2**20
"""Largest request body accepted (a conversation of 16 turns is a few kB)."""
_ROLES = ("system", "user", "assistant")
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""The seeds `torch.manual_seed` takes; a larger one would fail inside generation (HTTP 500)."""


class RequestError(ValueError):
    """A request the server refuses; the message goes back to the client with `status`."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


class ChatServer:
    """An OpenAI-compatible server for one in-process model; a context manager."""

    def __init__(
        self,
        client: LocalChatClient,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        max_tokens: int = 4096,
    ) -> None:
        """
        Args:
            client: the model that answers (its `model_id` is the served model's name).
            host: address to listen on.
            port: port to listen on; 0 picks a free one (see `url`).
            max_tokens: `max_tokens` of a request that sets none.
        """
        self.client = client
        self.max_tokens = max_tokens
        self._generating = threading.Lock()  # one generation at a time: the model is shared
        self.httpd = ThreadingHTTPServer((host, port), _handler_for(self))
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        """Base URL of the API, `http://host:port/v1`."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def serve_forever(self) -> None:
        """Answer requests until `shutdown` (from another thread) or an interrupt."""
        self.httpd.serve_forever()

    def start(self) -> threading.Thread:
        """Serve from a background thread (tests, notebooks); `close` stops it."""
        thread = threading.Thread(target=self.serve_forever, name="chat-server", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Stop serving and release the port."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ChatServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # ---- the API ------------------------------------------------------------------------------

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [{"id": self.client.model_id, "object": "model", "owned_by": "glam"}],
        }

    def chat_completion(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to one `/v1/chat/completions` request body.

        Raises:
            RequestError: a request this server cannot answer as asked.
        """
        messages = _messages(request.get("messages"))
        model = request.get("model")
        if model not in (None, "", self.client.model_id):
            raise RequestError(
                f"model {model!r} is not served here; /v1/models lists {self.client.model_id!r}",
                HTTPStatus.NOT_FOUND,
            )
        for name, allowed in (("stream", (None, False)), ("n", (None, 1)), ("top_p", (None, 1))):
            if request.get(name) not in allowed:
                raise RequestError(f"{name}={request.get(name)!r} is not supported here")
        if request.get("stop"):
            raise RequestError("stop sequences are not supported here")
        max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        temperature = request.get("temperature")
        temperature = 1.0 if temperature is None else temperature
        seed = request.get("seed")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise RequestError(f"temperature must be a number in [0, 2], got {temperature!r}")
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not SEED_MIN <= seed <= SEED_MAX
        ):
            raise RequestError(
                f"seed must be an integer in [-2**63, 2**64 - 1] (torch's seeds), got {seed!r}"
            )
        with self._generating:
            try:
                (completion,) = self.client.generate(
                    [messages],
                    temperature=float(temperature),
                    max_tokens=max_tokens,
                    seeds=None if seed is None else [seed],
                )
            except ChatClientError as error:
                raise RequestError(str(error)) from error
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.client.model_id,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": completion.text},
                    "finish_reason": completion.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "total_tokens": completion.prompt_tokens + completion.completion_tokens,
            },
        }

    def completion(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """The answer to one `/v1/completions` request body: the prompts' token log-probabilities.

        Raises:
            RequestError: a request this server cannot answer as asked.
        """
        model = request.get("model")
        if model not in (None, "", self.client.model_id):
            raise RequestError(
                f"model {model!r} is not served here; /v1/models lists {self.client.model_id!r}",
                HTTPStatus.NOT_FOUND,
            )
        max_tokens = request.get("max_tokens", 16)  # OpenAI's default
        if max_tokens not in (0, None) or request.get("echo") is not True:
            raise RequestError(
                "this server's /v1/completions only scores prompts: send echo=true and "
                "max_tokens=0 (to generate, use /v1/chat/completions)"
            )
        top = request.get("logprobs")
        if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20:
            raise RequestError(f"logprobs must be an integer in [0, 20], got {top!r}")
        prompts = request.get("prompt")
        prompts = [prompts] if isinstance(prompts, str) else prompts
        if (
            not isinstance(prompts, list)
            or not prompts
            or not all(isinstance(p, str) and p for p in prompts)
        ):
            raise RequestError("prompt must be a non-empty text or a list of non-empty texts")
        if model_kind(self.client.model) != "causal":
            raise RequestError(
                f"{self.client.model_id!r} is not a causal language model: echoed prompt "
                "log-probabilities need one"
            )
        with self._generating:
            choices = [
                {
                    "index": i,
                    "text": prompt,
                    "logprobs": _prompt_logprobs(self.client, prompt, top),
                    "finish_reason": "length",
                }
                for i, prompt in enumerate(prompts)
            ]
        tokens = sum(len(choice["logprobs"]["tokens"]) for choice in choices)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.client.model_id,
            "choices": choices,
            "usage": {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens},
        }


@torch.no_grad()
def _prompt_logprobs(client: LocalChatClient, prompt: str, top: int) -> dict[str, Any]:
    """OpenAI's `logprobs` object of `prompt` echoed: each token's log-probability given the
    ones before it (the tokenizer's special tokens included, as the scorer counts them)."""
    encoded = client.tokenizer(prompt, return_offsets_mapping=True)
    context = getattr(client.model.config, "max_position_embeddings", None)
    if isinstance(context, int) and len(encoded["input_ids"]) > context:
        # what vLLM answers too: past its positions a model's scores mean nothing
        raise RequestError(
            f"the prompt has {len(encoded['input_ids'])} tokens, past {client.model_id!r}'s "
            f"context of {context} (max_position_embeddings): shorten it"
        )
    ids = torch.tensor([encoded["input_ids"]])
    logits = client.model(input_ids=ids).logits[0].float()
    logprobs = torch.log_softmax(logits[:-1], dim=-1)  # row t predicts token t + 1
    chosen = logprobs.gather(1, ids[0, 1:, None])[:, 0]
    tokens = [client.tokenizer.decode([i]) for i in encoded["input_ids"]]
    text_offset = [start for start, _ in encoded["offset_mapping"]]
    best = logprobs.topk(top, dim=-1) if top else None
    top_logprobs: list[dict[str, float] | None] = [None]
    for t in range(len(tokens) - 1):
        entry = {tokens[t + 1]: float(chosen[t])}
        if best is not None:
            names = [client.tokenizer.decode([i]) for i in best.indices[t].tolist()]
            entry.update(zip(names, best.values[t].tolist(), strict=True))
        top_logprobs.append(entry)
    return {
        "tokens": tokens,
        "token_logprobs": [None, *chosen.tolist()],
        "text_offset": text_offset,
        "top_logprobs": top_logprobs,
    }


def _messages(raw: Any) -> list[Message]:
    """The request's messages, each content as one string (text parts joined by newlines).

    Raises:
        RequestError: a missing or malformed message list.
    """
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty list")
    messages = []
    for k, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise RequestError(f"messages[{k}] needs a role among {list(_ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts; BALROG sends text parts
            texts = [part.get("text") for part in content if isinstance(part, dict)]
            if any(part.get("type") != "text" for part in content if isinstance(part, dict)):
                raise RequestError(f"messages[{k}]: only text content parts are supported")
            content = "\n".join(text for text in texts if isinstance(text, str))
        if not isinstance(content, str):
            raise RequestError(f"messages[{k}].content must be text")
        messages.append({"role": message["role"], "content": content})
    return messages


def _handler_for(server: ChatServer) -> type[BaseHTTPRequestHandler]:
    """The request handler class bound to `server`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the client reuses its connection
        timeout = 120  # drop a connection that sends nothing for this long
        server_version = "glam-serve"

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.rstrip("/") == "/v1/models":
                self._reply(HTTPStatus.OK, server.models())
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no route GET {self.path}")

        def do_POST(self) -> None:  # noqa: N802
            routes = {
                "/v1/chat/completions": server.chat_completion,
                "/v1/completions": server.completion,
            }
            route = routes.get(self.path.rstrip("/"))
            if route is None:
                self._error(HTTPStatus.NOT_FOUND, f"no route POST {self.path}")
                return
            try:
                self._reply(HTTPStatus.OK, route(self._json_body()))
            except RequestError as error:
                self._error(error.status, str(error))
            except Exception as error:  # a failure of the model: say so, keep serving
                logger.exception("generation failed")
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"generation failed: {error!r}")

        def _json_body(self) -> dict[str, Any]:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError as error:
                raise RequestError("Content-Length is not a number") from error
            if length < 0:  # reading -n bytes reads to the end: a wait for a close never sent
                raise RequestError(f"Content-Length is negative ({length})")
            if length > MAX_BODY_BYTES:
                raise RequestError("request body too large", HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except ValueError as error:
                raise RequestError(f"the body is not JSON: {error}") from error
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            return body

        def _error(self, status: HTTPStatus, message: str) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self.close_connection = True  # the body may be unread: start the next one afresh
            self._reply(status, {"error": {"message": message, "type": kind, "code": status}})

        def _reply(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            logger.info("%s %s", self.address_string(), format % args)

    return Handler
