"""Behavioural cloning: bot demonstrations as a Hugging Face dataset, and SFT of the LLM with TRL.

- `glam.bc.demos`: the dataset schema, `DemoWriter` / `write_demos` (also for PPO rollouts) and
  `load_demos`;
- `glam.bc.bot`: BabyAI's bot rolled through BabyAI-Text (`scripts/collect_bot_demos.py`);
- `glam.bc.sft`: fine-tuning with TRL's SFTTrainer (`scripts/clm_behavioral_cloning.py`);
- `glam.bc.policy`: the saved policy folder and `load_bc_policy`, the evaluation harness's `bc`
  agent.

`glam.bc.sft` (which imports TRL) is not imported here, so that writing or reading
demonstrations stays cheap.
"""

from __future__ import annotations

from glam.bc.demos import (
    DEMO_FEATURES,
    DemoDatasetError,
    DemoRecord,
    DemoWriter,
    load_demos,
    write_demos,
)
from glam.bc.policy import BCPolicyInfo, load_bc_policy, read_bc_policy_info

__all__ = [
    "DEMO_FEATURES",
    "BCPolicyInfo",
    "DemoDatasetError",
    "DemoRecord",
    "DemoWriter",
    "load_bc_policy",
    "load_demos",
    "read_bc_policy_info",
    "write_demos",
]
