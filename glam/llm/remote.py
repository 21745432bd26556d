"""HTTP clients of OpenAI-compatible servers (vLLM, llama.cpp, `scripts/serve_openai.py`).

`OpenAIEndpoint` is the connection every client shares: the model to ask (`model_id`, else the
first the server lists at `/v1/models`), the API key, time-outs and retries. A request that
fails with a connection error, a time-out, HTTP 408, 429 or 5xx is tried again after
`delay * 2**(k-1)` seconds (k = 1, 2...), at most `max_retries` times; any other HTTP error (a
bad request, an unknown model) fails at once with the server's message. Every wait is bounded: a
try that has no complete answer `timeout` seconds after it started fails (a deadline for the
whole try, not for each read: a server that sends its answer a byte at a time cannot stretch
it), so a request gives up after at most `(1 + max_retries) * timeout` seconds plus the
back-off. An answer that is not what an OpenAI-compatible server sends (no JSON, a message
content that is not text, token counts that are not numbers) is a `ChatClientError`.

`OpenAIChatClient` writes answers: each conversation is one `POST {base_url}/chat/completions`
with `model`, `messages`, `max_tokens`, `temperature` (unless None) and `seed`; a batch is sent
concurrently, one thread per conversation, so a server that batches (vLLM) sees them together.
(`glam.teach.scorers.OpenAIScorer` scores texts through the same endpoint.)
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import requests
import urllib3

from glam.llm.chat import ChatClient, ChatClientError, Completion, Message
from glam.llm.config import ClientConfig

__all__ = ["OpenAIChatClient", "OpenAIEndpoint"]

logger = logging.getLogger(__name__)

_RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""HTTP statuses worth another try: the server is busy, restarting or timed out."""

Result = TypeVar("Result")


class _Retryable(Exception):
    """A failure that another try may not meet (connection, time-out, busy server)."""


class OpenAIEndpoint:
    """One OpenAI-compatible server: its model, the key, time-outs and retries."""

    def __init__(
        self,
        base_url: str,
        *,
        model_id: str = "",
        timeout: float = 60.0,
        max_retries: int = 4,
        delay: float = 2.0,
        api_key_env: str = "",
        setting: str = "client",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """Connect to `base_url` and find the model to ask (`model_id`, else the first one the
        server lists).

        Args:
            base_url: the API's address, up to and including `/v1`.
            model_id: the model named in each request; empty: the first the server lists.
            timeout: seconds a try may take in all, from the connection to the answer's last
                byte.
            max_retries: tries after a failed one (connection, time-out, 408, 429, 5xx).
            delay: back-off before retry k is `delay * 2**(k-1)` seconds.
            api_key_env: environment variable holding a bearer key; empty: no key.
            setting: the config section named in messages (`client`, `teach`).
            sleep: how to wait between tries (tests pass a recorder).

        Raises:
            ChatClientError: the endpoint cannot be reached, or does not answer `/v1/models`
                as an OpenAI-compatible server does, after the retries.
        """
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.delay = delay
        self.setting = setting
        self._sleep = sleep
        self._session = requests.Session()
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if api_key_env and not key:
            raise ChatClientError(
                f"{setting}.api_key_env={api_key_env!r}: no such environment variable is set"
            )
        if key:
            self._session.headers["Authorization"] = f"Bearer {key}"
        try:
            self.served_models = self._list_models()
            """Model ids the server lists at `/v1/models`."""
            self.model_id = model_id or self._only_model()
        except ChatClientError:
            self._session.close()
            raise
        if model_id and self.served_models and model_id not in self.served_models:
            logger.warning(
                "%s.model_id=%r is not among the models %s lists (%s); asking for it anyway",
                setting,
                model_id,
                self.base_url,
                ", ".join(self.served_models),
            )

    def post(self, path: str, payload: dict[str, Any]) -> Any:
        """The JSON answer to `POST {base_url}{path}` (or to `path` itself when it is a full
        URL), with retries.

        Raises:
            ChatClientError: a refusal (HTTP 4xx other than 408 and 429), or retries exhausted.
        """
        return self._with_retries(f"POST {path}", lambda: self._request("POST", path, payload))

    def close(self) -> None:
        self._session.close()

    def _list_models(self) -> list[str]:
        body = self._with_retries("GET /models", lambda: self._request("GET", "/models", None))
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise ChatClientError(
                f"{self.base_url}/models did not list models as an OpenAI-compatible server "
                f"does (no `data` list): check {self.setting}.base_url (it ends with /v1)"
            )
        return [str(item.get("id")) for item in data if isinstance(item, dict) and "id" in item]

    def _only_model(self) -> str:
        if not self.served_models:
            raise ChatClientError(
                f"{self.base_url}/models lists no model: set {self.setting}.model_id to the "
                "model to ask"
            )
        return self.served_models[0]

    def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> Any:
        """One try: the JSON answer, within `timeout` seconds in all.

        The try runs in a helper thread that reads the answer chunk by chunk and gives up at the
        deadline; this thread waits for it until then. A read blocked at the deadline (a server
        silent in the middle of its headers) ends at most `timeout` later in the helper, which
        nobody waits for (a daemon thread: it never holds up the interpreter's exit).
        """
        deadline = time.monotonic() + self.timeout
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def attempt() -> None:
            try:
                outcome["answer"] = self._request_until(method, path, payload, deadline)
            except BaseException as error:  # noqa: BLE001  (handed to the waiting thread)
                outcome["error"] = error
            finally:
                done.set()

        threading.Thread(target=attempt, name="glam-http", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic()) + 0.05):
            raise _Retryable(f"no complete answer within {self.timeout:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["answer"]

    def _request_until(
        self, method: str, path: str, payload: dict[str, Any] | None, deadline: float
    ) -> Any:
        # a full URL reaches a route beside /v1 (llama-cpp-python's /extras/tokenize)
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        try:
            with self._session.request(
                method, url, json=payload, timeout=(self.timeout, self.timeout), stream=True
            ) as response:
                body = _read_before(response, deadline, self.timeout)
        # urllib3's own errors come from reading the body ourselves (`_read_before`).
        except (requests.Timeout, urllib3.exceptions.ReadTimeoutError) as error:
            raise _Retryable(f"no answer within {self.timeout:g} s") from error
        except (requests.ConnectionError, urllib3.exceptions.HTTPError) as error:
            raise _Retryable(f"cannot connect ({_reason(error)})") from error
        status = response.status_code
        if status in _RETRIED_STATUS:
            raise _Retryable(f"HTTP {status}: {_server_message(body, response.reason)}")
        if status >= 400:
            raise ChatClientError(
                f"{method} {url} failed with HTTP {status}: {_server_message(body, response.reason)}"
            )
        try:
            return json.loads(body)
        except ValueError as error:
            raise ChatClientError(f"{method} {url} answered with no JSON body") from error

    def _with_retries(self, what: str, attempt: Callable[[], Result]) -> Result:
        """`attempt()`, tried again after a back-off while it fails in a retryable way."""
        tries = 1 + self.max_retries
        for k in range(1, tries + 1):
            try:
                return attempt()
            except _Retryable as error:
                if k == tries:
                    s = self.setting
                    raise ChatClientError(
                        f"{what} at {self.base_url} failed {tries} time(s), last: {error}. Is the "
                        f"server running at {s}.base_url (scripts/serve_openai.py, vLLM, "
                        f"llama.cpp)? Raise {s}.timeout or {s}.max_retries for a slow one."
                    ) from error
                wait = self.delay * 2 ** (k - 1)
                logger.warning(
                    "%s at %s: %s; retry %d/%d in %g s",
                    what,
                    self.base_url,
                    error,
                    k,
                    self.max_retries,
                    wait,
                )
                self._sleep(wait)
        raise AssertionError("unreachable")


class OpenAIChatClient(ChatClient):
    """An OpenAI-compatible `/v1/chat/completions` endpoint, with time-outs and retries."""

    def __init__(self, cfg: ClientConfig, *, sleep: Callable[[float], None] = time.sleep) -> None:
        """Connect to `cfg.base_url` and find the model to ask (see `OpenAIEndpoint`).

        Raises:
            ChatClientError: the endpoint cannot be reached or is not OpenAI-compatible.
        """
        self.cfg = cfg
        self.endpoint = OpenAIEndpoint(
            cfg.base_url,
            model_id=cfg.model_id,
            timeout=cfg.timeout,
            max_retries=cfg.max_retries,
            delay=cfg.delay,
            api_key_env=cfg.api_key_env,
            sleep=sleep,
        )
        self.base_url = self.endpoint.base_url
        self.served_models = self.endpoint.served_models
        self.model_id = self.endpoint.model_id
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0

    # ---- the interface ------------------------------------------------------------------------

    def complete(
        self,
        conversations: Sequence[Sequence[Message]],
        seeds: Sequence[int] | None = None,
        slots: Sequence[int] | None = None,
    ) -> list[Completion]:
        """`ChatClient.complete`; `slots` go unused: a server keeps its own prefix cache (vLLM's
        automatic prefix caching) and reports it in `usage.prompt_tokens_details`."""
        if seeds is not None and len(seeds) != len(conversations):
            raise ValueError(f"{len(seeds)} seeds for {len(conversations)} conversations")
        seeds = list(seeds) if seeds is not None else [None] * len(conversations)
        if len(conversations) <= 1:
            return [self._complete_one(c, s) for c, s in zip(conversations, seeds, strict=True)]
        if self._pool is None or self._pool_size < len(conversations):
            if self._pool is not None:
                self._pool.shutdown()
            self._pool = ThreadPoolExecutor(len(conversations), thread_name_prefix="chat")
            self._pool_size = len(conversations)
        return list(self._pool.map(self._complete_one, conversations, seeds))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        self.endpoint.close()

    # ---- one request --------------------------------------------------------------------------

    def _complete_one(self, messages: Sequence[Message], seed: int | None) -> Completion:
        payload: dict[str, Any] = {
            "model": self.model_id,
            "messages": list(messages),
            "max_tokens": self.cfg.max_tokens,
        }
        if self.cfg.temperature is not None:
            payload["temperature"] = self.cfg.temperature
        if seed is not None:
            payload["seed"] = int(seed)
        body = self.endpoint.post("/chat/completions", payload)
        where = f"{self.base_url}/chat/completions"
        try:
            choice = body["choices"][0]
            text = choice["message"].get("content") or ""
            usage = body.get("usage") or {}
            finish_reason = str(choice.get("finish_reason") or "stop")
        except (KeyError, IndexError, TypeError, AttributeError) as error:
            raise ChatClientError(
                f"{where} answered without choices[0].message ({error!r}): is it an "
                "OpenAI-compatible server?"
            ) from error
        if not isinstance(text, str):
            raise ChatClientError(
                f"{where} answered a message content that is not text "
                f"({type(text).__name__}: {str(text)[:80]!r}): is it an OpenAI-compatible server?"
            )
        if not isinstance(usage, dict):
            raise ChatClientError(f"{where} answered a usage that is not an object: {usage!r:.80}")
        details = usage.get("prompt_tokens_details") or {}
        cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else None
        counts = [usage.get(key, 0) for key in ("prompt_tokens", "completion_tokens")] + [cached]
        if not all(_is_count(n) for n in counts):
            raise ChatClientError(
                f"{where} answered token counts that are not counts (usage {usage!r:.120})"
            )
        return Completion(
            text=text,
            finish_reason=finish_reason,
            prompt_tokens=int(counts[0]),
            completion_tokens=int(counts[1]),
            cached_tokens=int(counts[2]),
        )


def _is_count(value: Any) -> bool:
    """A whole number >= 0 (`12`, or `12.0` as some servers write it), not a bool or a text."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value >= 0
        and float(value).is_integer()
    )


def _reason(error: Exception) -> str:
    """The operating system's reason inside a connection error ("[Errno 111] Connection
    refused"), else the whole message."""
    text = str(error)
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    return found.group(0) if found else text


def _read_before(response: requests.Response, deadline: float, timeout: float) -> bytes:
    """The answer's body, read chunk by chunk until `deadline` (`time.monotonic`).

    Raises:
        _Retryable: the body was not complete at the deadline.
    """
    chunks = []
    while chunk := response.raw.read1(1 << 16, decode_content=True):  # what has come, <= 64 kB
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise _Retryable(f"no complete answer within {timeout:g} s")
    return b"".join(chunks)


def _server_message(body: bytes, reason: str | None) -> str:
    """The error message an OpenAI-compatible server put in its body, else the body's start."""
    try:
        answer = json.loads(body)
    except ValueError:
        return body[:300].decode("utf-8", "replace") or reason or ""
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message", answer["error"]))
    return str(answer)[:300]
