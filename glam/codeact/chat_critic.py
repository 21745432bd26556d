"""RL-GPT's critic as a language model (`codeact.critic=chat`): after each RL phase a chat model
reads each coded action's statistics and errors and says whether to keep, drop or rewrite it.

RL-GPT's critic is GPT-4 reading the execution results; the rule-based `Critic`
(`glam.codeact.critic.judge`) stays the default because the embedded 135M model cannot judge
code. The question goes through the same OpenAI-compatible client as the code writer and the
chat chooser (`glam.llm.remote.OpenAIChatClient`, `codeact.base_url`).

The answer is read line by line (`parse_verdicts`): `<name>: keep|drop|rewrite: <reason>`.
What the model cannot decide is decided by the rules, and the reason says so:

- an action the answer does not name (or names twice: the first verdict counts);
- `rewrite` of an action that cannot be rewritten (library code, or code already rewritten once)
  becomes `drop`: the model judged it failing, and only generated code gets a second version.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from glam.codeact.critic import VERDICTS, Critic, CriticRules, Decision, stats_record
from glam.codeact.env import CodedActionStats
from glam.codeact.planner import MissionFamily
from glam.llm.chat import ChatClient, Message

__all__ = ["ChatCritic", "critic_messages", "parse_verdicts"]

_VERDICT = re.compile(r"\b(" + "|".join(VERDICTS) + r")\b", re.IGNORECASE)


class ChatCritic(Critic):
    """A chat model's verdicts (module docstring)."""

    name = "chat"

    def __init__(
        self, client: ChatClient, family: MissionFamily, *, seed: int | None = None
    ) -> None:
        """`client` is shared, not owned; `family`: the level, as the other agents know it;
        `seed`: the sampling seed of each question."""
        self.client = client
        self.family = family
        self.seed = seed
        self.answers: list[str] = []
        """Every answer, as written (the run's records keep the decisions and reasons)."""

    def decide(
        self,
        stats: Mapping[str, CodedActionStats],
        rules: CriticRules | None = None,
        rewritable: Collection[str] = (),
    ) -> dict[str, Decision]:
        if not stats:
            return {}
        messages = critic_messages(self.family, stats, rewritable)
        seeds = None if self.seed is None else [self.seed]
        (completion,) = self.client.complete([messages], seeds)
        self.answers.append(completion.text)
        said = parse_verdicts(completion.text, list(stats))
        by_rules = super().decide(stats, rules, rewritable)
        decisions = {}
        for name in stats:
            if name not in said:
                rule = by_rules[name]
                reason = f"the chat critic gave no verdict; by the rules: {rule.reason}"
                decisions[name] = Decision(rule.verdict, reason)
                continue
            verdict, reason = said[name]
            if verdict == "rewrite" and name not in rewritable:
                verdict, reason = "drop", f"{reason} (rewrite asked, but it cannot be rewritten)"
            decisions[name] = Decision(verdict, f"chat critic: {reason}")
        return decisions


def critic_messages(
    family: MissionFamily, stats: Mapping[str, CodedActionStats], rewritable: Collection[str]
) -> list[Message]:
    """The question: the level's missions, then each action's statistics over the phase."""
    system = (
        "You are the critic of a reinforcement-learning agent in a BabyAI grid world. Some of "
        "its actions are coded actions: Python functions that run for several primitive steps. "
        "After each training phase you decide what becomes of each coded action: keep it, drop "
        "it (another sub-action takes its place) or rewrite it (its code is written again from "
        "its errors; only for generated code that has not been rewritten yet)."
    )
    missions = "\n".join(f"- {mission}" for mission in family.missions)
    lines = []
    for name, entry in stats.items():
        record = stats_record(entry)
        failures = ", ".join(f"{kind} {n}" for kind, n in sorted(record["failures"].items()))
        outcomes = ", ".join(f"{kind} {n}" for kind, n in sorted(record["outcomes"].items()))
        line = (
            f"- {name}: used {record['uses']} times, finished {record['finished']}, outcomes "
            f"({outcomes or 'none'}), failures ({failures or 'none'}), reward "
            f"{record['reward']:.2f}, {record['primitive_steps']} primitive steps; "
            + ("generated code, can be rewritten" if name in rewritable else "cannot be rewritten")
        )
        if record["errors"]:
            line += f"; last error: {record['errors'][-1]}"
        lines.append(line)
    user = (
        f"Level: {family.level}. Missions, for example:\n{missions}\n\n"
        "The coded actions after this phase:\n" + "\n".join(lines) + "\n\n"
        "Answer one line per coded action, exactly: <name>: keep|drop|rewrite: <one-sentence "
        "reason>"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def parse_verdicts(text: str, names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """name -> (verdict, reason) of each line of `text` that names one of `names` (the
    longest one, where one name holds another) and a verdict after it; the first verdict of a
    name counts."""
    verdicts: dict[str, tuple[str, str]] = {}
    longest_first = sorted(names, key=len, reverse=True)
    for raw in text.splitlines():
        line = raw.strip().strip("-*` ")
        lowered = line.lower()
        name = next((n for n in longest_first if n.lower() in lowered), None)
        if name is None or name in verdicts:
            continue
        after = lowered.index(name.lower()) + len(name)
        match = _VERDICT.search(lowered, after)
        if match is None:
            continue
        reason = line[match.end() :].strip(" :-,.;") or "no reason given"
        verdicts[name] = (match.group(1).lower(), reason)
    return verdicts
