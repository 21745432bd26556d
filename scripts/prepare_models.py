"""Convert the embedded model(s) into the safetensors cache once, so later loads take a second.

    python scripts/prepare_models.py                 # the default embedded model
    python scripts/prepare_models.py smollm2-135m    # a named one

The cache lives in `$GLAM_CACHE/models` (default `~/.cache/glam/models`).
"""

from __future__ import annotations

import sys

from glam.models.loading import DEFAULT_MODEL, prepare_embedded_model


def main(argv: list[str]) -> int:
    for name in argv or [DEFAULT_MODEL]:
        folder = prepare_embedded_model(name)
        print(f"[glam] embedded model {name!r} ready in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
