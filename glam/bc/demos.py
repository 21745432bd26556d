"""The demonstrations dataset moved to `glam.demos` (the PPO trainer writes it too, and
`glam.ppo` sits below `glam.bc`); this module keeps the old import path working."""

from __future__ import annotations

from glam.demos import (
    DEMO_FEATURES,
    REQUIRED_COLUMNS,
    DemoDatasetError,
    DemoRecord,
    DemoWriter,
    demo_metadata,
    load_demos,
    write_demos,
)

__all__ = [
    "DEMO_FEATURES",
    "REQUIRED_COLUMNS",
    "DemoDatasetError",
    "DemoRecord",
    "DemoWriter",
    "demo_metadata",
    "load_demos",
    "write_demos",
]
