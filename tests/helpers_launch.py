"""The command prefix that starts a script under `accelerate launch`, for subprocess tests.

from helpers_launch import accelerate_launch

subprocess.run([*accelerate_launch("multi_cpu", 2), "scripts/train_baseline.py", ...])
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def accelerate_launch(layout: str, num_processes: int | None = None) -> list[str]:
    """`python -m accelerate.commands.launch` with `configs/accelerate/<layout>.yaml`, and
    `--num_processes` when given (otherwise the file's count)."""
    config = ROOT / "configs" / "accelerate" / f"{layout}.yaml"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    if num_processes is not None:
        command += ["--num_processes", str(num_processes)]
    return command
