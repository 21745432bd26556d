"""Behavioural cloning: bot demonstrations as a Hugging Face dataset, and SFT of the LLM with TRL.

- `glam.bc.bot`: BabyAI's bot rolled through BabyAI-Text (`scripts/collect_bot_demos.py`);
- `glam.bc.sft`: fine-tuning with TRL's SFTTrainer (`scripts/clm_behavioral_cloning.py`);
- `glam.bc.episodes`: the greedy success rate it reports, played by the evaluation harness.

What other packages share is defined below this one and re-exported here: the dataset schema,
`DemoWriter` / `write_demos` and `load_demos` (`glam.demos`, which the PPO trainer writes its
rollouts with), and the saved policy folder with `load_bc_policy`, the evaluation harness's `bc`
agent (`glam.policy.bc_policy`).

`glam.bc.sft` (which imports TRL) is not imported here, so that writing or reading
demonstrations stays cheap.
"""

from __future__ import annotations

from glam.demos import (
    DEMO_COLUMNS,
    DemoDatasetError,
    DemoRecord,
    DemoWriter,
    load_demos,
    write_demos,
)
from glam.policy.bc_policy import BCPolicyInfo, load_bc_policy, read_bc_policy_info

__all__ = [
    "DEMO_COLUMNS",
    "BCPolicyInfo",
    "DemoDatasetError",
    "DemoRecord",
    "DemoWriter",
    "load_bc_policy",
    "load_demos",
    "read_bc_policy_info",
    "write_demos",
]
