"""The command prefix that starts a script under `accelerate launch`, for subprocess tests.

from helpers_launch import accelerate_launch

subprocess.run([*accelerate_launch("multi_cpu", 2), "scripts/train_baseline.py", ...])
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def accelerate_launch(layout: str, num_processes: int | None = None) -> list[str]:
    """`python -m accelerate.commands.launch` with `configs/accelerate/<layout>.yaml`, and
    `--num_processes` when given (otherwise the file's count). The rendezvous is on a free port:
    the suite's workers may launch at the same time (the default, 29500, would be taken)."""
    config = ROOT / "configs" / "accelerate" / f"{layout}.yaml"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    command += ["--main_process_port", str(free_port())]
    if num_processes is not None:
        command += ["--num_processes", str(num_processes)]
    return command


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
