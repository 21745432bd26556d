"""One interface for a chat model, whether it runs in this process or behind a socket.

A `ChatClient` answers a batch of conversations (lists of `{"role", "content"}` messages, as in
OpenAI's chat API), one `Completion` each. The in-process client (`glam.llm.local`) batches them
through its model, reusing each env slot's last turn; the HTTP client (`glam.llm.remote`) sends
them concurrently to an OpenAI-compatible server. Time-outs, retries and a clean shutdown are the client's job: the
caller sees answers or a `ChatClientError` that says what failed and what to do.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

__all__ = ["ChatClient", "ChatClientError", "Completion", "Message", "render_transcript"]

Message = dict[str, str]
"""One chat message: `{"role": "system" | "user" | "assistant", "content": text}`."""


class ChatClientError(RuntimeError):
    """The model could not answer: an unreachable or failing endpoint, or a refused request."""


@dataclass(frozen=True)
class Completion:
    """One answer of the model."""

    text: str
    """The generated text, as the model wrote it (special tokens removed, not stripped)."""
    finish_reason: str
    """`stop` (the model ended its answer) or `length` (cut at the token limit)."""
    prompt_tokens: int
    """Tokens of the conversation as the model read it (chat template included)."""
    completion_tokens: int
    """Tokens generated."""
    cached_tokens: int = 0
    """Of `prompt_tokens`, those whose keys and values came from a cache instead of being
    computed (OpenAI's `usage.prompt_tokens_details.cached_tokens`)."""


class ChatClient(ABC):
    """A chat model that answers conversations; use it as a context manager to close it."""

    model_id: str = ""
    """Name of the model that answers (in reports)."""

    @abstractmethod
    def complete(
        self,
        conversations: Sequence[Sequence[Message]],
        seeds: Sequence[int] | None = None,
        slots: Sequence[int] | None = None,
    ) -> list[Completion]:
        """One completion per conversation, in order.

        Args:
            conversations: the chat turns of each request.
            seeds: one sampling seed per conversation (None: unseeded). The same seed and
                conversation give the same answer from a client that honours seeds.
            slots: one distinct key per conversation, stable over an episode (the env slot that
                plays it). A client may keep what it computed for a slot's conversation and
                reuse it when the slot's next conversation starts the same way (the in-process
                client's turn cache); the answers are the same either way. None: nothing is
                kept.

        Raises:
            ChatClientError: the model could not answer (after the client's retries).
        """

    def close(self) -> None:  # noqa: B027 (nothing to release by default)
        """Release the client's resources (connections, threads); idempotent."""

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def render_transcript(messages: Sequence[Message]) -> str:
    """A conversation as readable text (`role: content` blocks), for reports and logs."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
