"""Serve a model over an OpenAI-compatible API (`/v1/models`, `/v1/chat/completions`).

    # one CPU: the embedded model (SmolLM2-135M-Instruct) on http://127.0.0.1:8080/v1
    python scripts/serve_openai.py
    python scripts/serve_openai.py port=0          # a free port; the URL is printed

    # one GPU: any model spec (for throughput on a GPU, vLLM is the server to use)
    python scripts/serve_openai.py model=/models/Llama-3.2-1B-Instruct dtype=bfloat16

    # then evaluate through it
    python scripts/zero_shot_generation.py eval.client.backend=openai \
        eval.client.base_url=http://127.0.0.1:8080/v1

One request at a time, no streaming; each request is sampled under its own `seed` exactly as
the in-process client samples it with `agent.batch_size=1`. It listens on 127.0.0.1 unless
`host` says otherwise. The first line printed is `serving MODEL_ID at URL`. Stops on Ctrl-C or
SIGTERM. Options: glam/llm/config.py (ServeConfig). Exit status: 0 stopped, 1 bad config, 2 the
model cannot be loaded or the port is taken.
"""

from __future__ import annotations

import logging
import signal
import sys

from glam.cli import fail
from glam.config import config_main, register_configs
from glam.llm.config import ServeConfig

register_configs()


@config_main(ServeConfig, config_path="../configs/serve", config_name="openai")
def main(config: ServeConfig) -> None:
    import torch

    from glam.eval.builders import resolve_device
    from glam.llm.local import LocalChatClient
    from glam.llm.server import ChatServer
    from glam.models.loading import ModelNotFoundError, load_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    try:
        model, tokenizer = load_model(config.model, dtype=config.dtype)
    except ModelNotFoundError as error:
        fail(error)
    model.to(resolve_device(config.device))
    client = LocalChatClient(
        model, tokenizer, model_id=config.model_id or config.model, batch_size=1
    )
    try:
        server = ChatServer(
            client, host=config.host, port=config.port, max_tokens=config.max_tokens
        )
    except OSError as error:
        fail(f"cannot listen on {config.host}:{config.port}: {error}")
    # SIGTERM (a job scheduler, `kill`) stops the server as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"serving {client.model_id} at {server.url}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
