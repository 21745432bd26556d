"""Evaluation: post-training test suites, agents, seeded batched episodes, reports.

- `suites`: the test suites (prompt rewrites and env changes), one table.
- `agents`: one interface for trained checkpoints, zero-shot models, BC, random and the bot.
- `teacher_agent`, `mediator_agent`: the couplings' agents (LLM4Teach's teacher alone, LLM4RL's
  mediator in its mediated envs, with its queries per episode).
- `generation`: BALROG's protocol, where the model writes its action in BALROG's dialogue.
- `episodes`: exactly N seeded episodes of a suite, batched over envs.
- `stats`, `report`: Wilson intervals, BALROG's progression ± standard error,
  JSON/CSV/markdown/PNG, aggregation over runs and seeds.
- `harness`: all of it for `scripts/post_training_tests.py`.
"""

from __future__ import annotations

from glam.eval.suites import SUITES, Suite, get_suites

__all__ = ["SUITES", "Suite", "get_suites"]
