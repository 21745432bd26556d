"""Language models behind one chat interface, in this process or behind an HTTP endpoint.

- `glam.llm.chat`: the `ChatClient` interface, `Completion`, `ChatClientError`.
- `glam.llm.local`: `LocalChatClient`, a Hugging Face model answering in this process.
- `glam.llm.remote`: `OpenAIChatClient`, any OpenAI-compatible server (vLLM, llama.cpp...).
- `glam.llm.server`: `ChatServer`, an OpenAI-compatible server in front of a local client.
- `glam.llm.config`: `ClientConfig` (which model answers, sampling, time-out, retries) and
  `ServeConfig` (`scripts/serve_openai.py`).

Nothing heavy is imported here: `glam.llm.config` stays free of torch.
"""
