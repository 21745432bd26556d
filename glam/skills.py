"""Skills: what a subgoal such as "go to the red ball" would do next, in the env's true state.

The couplings that put an LLM above a low-level controller (the LLM4Teach teacher, the LLM4RL
planner, ../shared/REFERENCE.md) let the language model choose among subgoals in words and have
hand-written skills carry them out. The skills here are BabyAI's bot (`minigrid.utils.baby_ai_bot`)
cut at its subgoals:

- ``go to the <color> <type>``: walk until facing the closest such object (ball, box, key, door);
- ``pick up the <color> <type>``: go to it and pick it up (ball, box, key; hands must be empty);
- ``open the <color> door``: go to the closest such door and open it (fetching its key if locked);
- ``drop``: put down what the agent carries, in front of it or at the nearest free cell;
- ``explore``: walk to the closest cell not seen yet, or open a door to see further.

A `SkillMap` holds one episode's map of seen cells (the bot plans only through cells it has seen);
`SkillMap.next_action` answers from a fresh plan each time, so the answer depends on the state and
the map, never on what was asked before. It returns None when the subgoal is already done, does
not apply (nothing to drop, no such object) or the bot's planner gives up.

`candidate_subgoals` lists the subgoals of the current view (what a teacher or planner chooses
among), and `expert_subgoal` names what BabyAI's bot, solving the whole mission, is about to do
(the reference a chosen subgoal is compared with).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from minigrid.core.world_object import WorldObj
from minigrid.envs.babyai.core.verifier import ObjDesc
from minigrid.utils.baby_ai_bot import (
    BabyAIBot,
    DropSubgoal,
    ExploreSubgoal,
    GoNextToSubgoal,
    OpenSubgoal,
    PickupSubgoal,
)

__all__ = [
    "SkillMap",
    "Subgoal",
    "candidate_subgoals",
    "expert_subgoal",
    "parse_subgoal",
]

_COLORS = ("red", "green", "blue", "purple", "yellow", "grey")
_CARRIABLE = ("ball", "box", "key")
_OBJECTS = (*_CARRIABLE, "door")
_PATTERN = re.compile(
    rf"^(?:(?P<verb>go to|pick up|open) the (?P<color>{'|'.join(_COLORS)}) "
    rf"(?P<type>{'|'.join(_OBJECTS)})|(?P<bare>drop|explore))$"
)
# Replanning steps a skill may take before it must have suggested an action: the bot's own plans
# need a handful (a blocker moved out of the way is about ten); more means it is going in circles.
_MAX_REPLANS = 64


@dataclass(frozen=True)
class Subgoal:
    """A parsed subgoal: `kind` is "go to", "pick up", "open", "drop" or "explore"."""

    kind: str
    color: str | None = None
    type: str | None = None

    def __str__(self) -> str:
        if self.color is None:
            return self.kind
        return f"{self.kind} the {self.color} {self.type}"


def parse_subgoal(text: str) -> Subgoal:
    """The subgoal a text names; ValueError naming the text if it names none."""
    match = _PATTERN.match(text.strip())
    if match is None or (match["verb"] == "pick up" and match["type"] == "door"):
        raise ValueError(
            f"not a subgoal: {text!r} (expected 'go to the <color> <ball|box|key|door>', "
            "'pick up the <color> <ball|box|key>', 'open the <color> door', 'drop' or 'explore')"
        )
    if match["verb"] == "open" and match["type"] != "door":
        raise ValueError(f"not a subgoal: {text!r} (only doors can be opened)")
    if match["bare"]:
        return Subgoal(match["bare"])
    return Subgoal(match["verb"], match["color"], match["type"])


class _PlanningBot(BabyAIBot):
    """BabyAI's bot without a mission of its own: its planner, subgoals and map of seen cells."""

    def __init__(self, env: Any) -> None:  # noqa: D107 (no call to BabyAIBot.__init__: no mission)
        self.mission = env
        self.vis_mask = np.zeros((env.width, env.height), dtype=bool)
        self.stack = []
        self.bfs_counter = 0
        self.bfs_step_counter = 0


class SkillMap:
    """One episode's skills: the map of cells seen so far and the subgoals' next actions."""

    def __init__(self, env: Any) -> None:
        """`env` is a BabyAI env (`TextEnv.unwrapped`) at the start of an episode."""
        self.env = env.unwrapped
        self._bot = _PlanningBot(self.env)

    def observe(self) -> None:
        """Add what the agent sees now to the map (call it once in every state)."""
        self._bot._process_obs()

    def next_action(self, subgoal: str | Subgoal) -> int | None:
        """Minigrid's action the subgoal's skill takes now; None if done or not applicable."""
        goal = parse_subgoal(subgoal) if isinstance(subgoal, str) else subgoal
        env, bot = self.env, self._bot
        carrying = env.carrying
        if goal.kind == "drop" and carrying is None:
            return None
        if goal.kind == "pick up" and carrying is not None:
            # Done if it is the object asked for; otherwise the hands must be emptied first.
            return None
        bot.stack = self._plan(goal)
        if bot.stack is None:
            bot.stack = []
            return None
        try:
            return self._first_action()
        except (AssertionError, IndexError, TypeError):  # the bot's planner gives up by asserting
            return None
        finally:
            bot.stack = []

    def _plan(self, goal: Subgoal) -> list | None:
        """The bot's subgoal stack (top last) that carries out `goal`; None if nothing to do."""
        bot = self._bot
        if goal.kind == "explore":
            return [ExploreSubgoal(bot)]
        if goal.kind == "drop":
            if self.env.grid.get(*self.env.front_pos) is None:
                return [DropSubgoal(bot)]
            return [DropSubgoal(bot), GoNextToSubgoal(bot, bot._find_drop_pos())]
        desc = ObjDesc(goal.type, goal.color)
        desc.find_matching_objs(self.env)
        if goal.kind == "open":  # the closest closed one: an open door is not to be opened
            pairs = zip(desc.obj_set, desc.obj_poss, strict=True)
            closed = [(door, pos) for door, pos in pairs if not door.is_open]
            desc.obj_set, desc.obj_poss = [d for d, _ in closed], [p for _, p in closed]
        if not desc.obj_set:
            return None
        if goal.kind == "go to":
            return [GoNextToSubgoal(bot, desc)]
        if goal.kind == "pick up":
            return [PickupSubgoal(bot), GoNextToSubgoal(bot, desc)]
        return [OpenSubgoal(bot), GoNextToSubgoal(bot, desc, reason="Open")]

    def _first_action(self) -> int | None:
        """Replan the stack as the bot does until a subgoal suggests an action (None: done)."""
        stack = self._bot.stack
        for _ in range(_MAX_REPLANS):
            if not stack:
                return None
            action = stack[-1].replan_before_action()
            if action is not None:
                return int(action)
        return None


def candidate_subgoals(env: Any) -> list[str]:
    """The subgoals of the agent's current view, in a fixed order.

    "go to" each kind of object in view, "pick up" each ball, box and key in view (hands empty),
    "open" each closed door in view, "drop" when carrying, and always "explore".
    """
    env = env.unwrapped
    view, visible = env.gen_obs_grid()
    seen: set[tuple[str, str]] = set()
    closed_doors: set[str] = set()
    for i in range(view.width):
        for j in range(view.height):
            cell = view.get(i, j)
            if cell is None or not visible[i, j] or cell.type not in _OBJECTS:
                continue
            # The agent's own cell holds what it carries in the view grid; that is not in view.
            if (i, j) == (view.width // 2, view.height - 1):
                continue
            seen.add((cell.color, cell.type))
            if cell.type == "door" and not cell.is_open:
                closed_doors.add(cell.color)
    ordered = sorted(seen, key=lambda ct: (_OBJECTS.index(ct[1]), _COLORS.index(ct[0])))
    subgoals = [f"go to the {color} {obj_type}" for color, obj_type in ordered]
    if env.carrying is None:
        subgoals += [f"pick up the {c} {t}" for c, t in ordered if t in _CARRIABLE]
    subgoals += [f"open the {c} door" for c in sorted(closed_doors, key=_COLORS.index)]
    if env.carrying is not None:
        subgoals.append("drop")
    subgoals.append("explore")
    return subgoals


def expert_subgoal(bot: BabyAIBot) -> str | None:
    """The subgoal BabyAI's bot is pursuing, in the words of `candidate_subgoals`.

    Call it right after `bot.replan()`: the top of the bot's stack is the subgoal that chose the
    action. A walk is named by what it is for (going next to an object to pick it up is
    "pick up the ..."; to a free cell to drop there is "drop"). None when the stack is empty.
    """
    stack = bot.stack
    if not stack:
        return None
    top = stack[-1]
    below = stack[-2] if len(stack) > 1 else None
    env = bot.mission.unwrapped
    if isinstance(top, ExploreSubgoal) or (
        isinstance(top, GoNextToSubgoal) and top.reason == "Explore"
    ):
        return "explore"
    if isinstance(top, DropSubgoal):
        return "drop"
    if isinstance(top, PickupSubgoal | OpenSubgoal):
        target = env.grid.get(*env.front_pos)
        verb = "pick up" if isinstance(top, PickupSubgoal) else "open"
        return f"{verb} the {target.color} {target.type}" if target is not None else None
    if not isinstance(top, GoNextToSubgoal):
        return None
    target = _target_of(bot, top.datum)
    if target is None:  # a walk to a free cell: to drop there, or to get out of the way
        return "drop" if isinstance(below, DropSubgoal) else "explore"
    if isinstance(below, PickupSubgoal) and target.type in _CARRIABLE:
        return f"pick up the {target.color} {target.type}"
    if isinstance(below, OpenSubgoal) and target.type == "door":
        return f"open the {target.color} door"
    return f"go to the {target.color} {target.type}"


def _target_of(bot: BabyAIBot, datum: Any) -> WorldObj | None:
    """The object a bot's walk goes to (None for a bare position without one)."""
    if isinstance(datum, WorldObj):
        return datum
    if isinstance(datum, ObjDesc):
        obj, _ = bot._find_obj_pos(datum)
        return obj
    return None
