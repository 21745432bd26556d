"""Our skills written as coded actions: parameterised source templates over `glam.codeact.api`.

What the embedded model (which cannot write reliable code) selects and parameterises, and what
a code-writing model's actions are compared with. Each function returns the source of one coded
action; `skill_source("go to the red ball")` parses the name.

- `go_to(color, type)`: walk until facing the closest visible such object (a shortest path in
  the egocentric grid, replanned at each step); while none is visible, look around and wander.
- `pick_up(color, type)`: go to it, pick it up; done once carried (dropping first what else
  is carried).
- `open_door(color)`: go to such a door and toggle it (a locked door opens only with its key in
  hand); done once it is open.
- `explore(steps)`: open the closed door in front, walk to the closest cell next to an unseen
  one (or to a closed door), else turn; done after `steps` primitive steps.

The planner shared by the templates (`PLANNER`) is part of every source: a coded action is
self-contained. A color or type of None matches any. With `mission=True`, `go_to` and `pick_up`
take their object from the mission at each step: the first object it names ("go to the object
in the mission", "pick up the object in the mission"; `MISSION_SKILLS`).
"""

from __future__ import annotations

import re

__all__ = ["MISSION_SKILLS", "PLANNER", "explore", "go_to", "open_door", "pick_up", "skill_source"]

_COLORS = ("red", "green", "blue", "purple", "yellow", "grey")
_TYPES = ("ball", "box", "key", "door")

PLANNER = '''
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # facing up, right, down, left in view["grid"]


def passable(cell):
    return cell[0] in ("empty", "floor", "goal") or (cell[0] == "door" and cell[2] == "open")


def first_move(grid, targets):
    """The first action of a shortest path from the agent to facing a cell of targets (a set
    of (row, col)), through passable cells of the grid; None if there is none."""
    start = (6, 3, 0)
    first = {start: None}
    queue = [start]
    head = 0
    while head < len(queue):
        row, col, facing = queue[head]
        head += 1
        drow, dcol = MOVES[facing]
        if (row + drow, col + dcol) in targets:
            return first[(row, col, facing)]
        nexts = [("turn left", (row, col, (facing + 3) % 4)),
                 ("turn right", (row, col, (facing + 1) % 4))]
        ahead = (row + drow, col + dcol)
        if 0 <= ahead[0] < 7 and 0 <= ahead[1] < 7 and passable(grid[ahead[0]][ahead[1]]):
            nexts.append(("go forward", (ahead[0], ahead[1], facing)))
        for action, state in nexts:
            if state not in first:
                first[state] = first[(row, col, facing)] or action
                queue.append(state)
    return None


def cells(grid, wanted):
    """The (row, col) of the grid's cells for which wanted(cell) holds, the agent's excepted."""
    return set((row, col) for row in range(7) for col in range(7)
               if (row, col) != (6, 3) and wanted(grid[row][col]))


def wander(view, memory):
    """Look around (three left turns), then walk ahead (or turn right when blocked)."""
    turns = memory.get("turns", 0)
    if turns < 3:
        memory["turns"] = turns + 1
        return "turn left"
    memory["turns"] = 0
    return "go forward" if passable(view["front"]) else "turn right"


def approach(view, memory, wanted):
    """The next action towards facing the closest cell for which wanted(cell) holds (None
    when facing one already)."""
    if wanted(view["front"]):
        return None
    targets = cells(view["grid"], wanted)
    move = first_move(view["grid"], targets) if targets else None
    return move or wander(view, memory)
'''


def _matcher(color: str | None, kind: str | None, state: str | None = None) -> str:
    return f"""
COLOR, TYPE, STATE = {color!r}, {kind!r}, {state!r}


def is_target(cell):
    return ((TYPE is None or cell[0] == TYPE) and (COLOR is None or cell[1] == COLOR)
            and (STATE is None or cell[2] == STATE))
"""


_MISSION_MATCHER = f"""
COLORS = {_COLORS!r}
TYPES = {_TYPES!r}
MISSION = [""]


def mission_object(mission):
    words = mission.replace(",", " ").split()
    for i in range(len(words)):
        if words[i] in TYPES:
            return (words[i - 1] if i > 0 and words[i - 1] in COLORS else None), words[i]
    return None, None


def is_target(cell):
    color, kind = mission_object(MISSION[0])
    return kind is not None and cell[0] == kind and (color is None or cell[1] == color)
"""
_READ_MISSION = '    MISSION[0] = view["mission"]\n'


def go_to(color: str | None, kind: str | None, *, mission: bool = False) -> str:
    """Walk until facing the closest visible `color` `kind` object (see the module docstring);
    `mission`: the first object the mission names instead."""
    return (
        PLANNER
        + (_MISSION_MATCHER if mission else _matcher(color, kind))
        + """

def step(view, memory):
"""
        + (_READ_MISSION if mission else "")
        + """    return approach(view, memory, is_target) or "done"
"""
    )


def pick_up(color: str | None, kind: str | None, *, mission: bool = False) -> str:
    """Go to the closest `color` `kind` object and pick it up; `mission`: the first object the
    mission names instead."""
    return (
        PLANNER
        + (_MISSION_MATCHER if mission else _matcher(color, kind))
        + """

def step(view, memory):
"""
        + (_READ_MISSION if mission else "")
        + """    carrying = view["carrying"]
    if carrying is not None and is_target(carrying + ("",)):
        return "done"
    if carrying is not None:  # hands full of something else: put it down where there is room
        return "drop" if view["front"][0] == "empty" else "turn left"
    return approach(view, memory, is_target) or "pick up"
"""
    )


def open_door(color: str | None) -> str:
    """Go to the closest `color` door that is not open and open it."""
    return (
        PLANNER
        + _matcher(color, "door")
        + """

def closed(cell):
    return is_target(cell) and cell[2] != "open"


def step(view, memory):
    front = view["front"]
    if is_target(front) and front[2] == "open" and memory.get("toggled"):
        return "done"
    move = approach(view, memory, closed)
    if move is not None:
        return move
    if front[2] == "locked" and view["carrying"] != ("key", front[1]):
        return "done"  # no key in hand: nothing more to do here
    memory["toggled"] = True
    return "toggle"
"""
    )


def explore(steps: int = 16) -> str:
    """Open closed doors ahead and walk towards what is unseen, for `steps` primitive steps."""
    return (
        PLANNER
        + f"\nLIMIT = {int(steps)}\n"
        + '''

def frontier(grid):
    """Passable cells next to an unseen cell."""
    found = set()
    for row, col in cells(grid, passable):
        for drow, dcol in MOVES:
            near = (row + drow, col + dcol)
            if 0 <= near[0] < 7 and 0 <= near[1] < 7 and grid[near[0]][near[1]][0] == "unseen":
                found.add((row, col))
    return found


def step(view, memory):
    if view["steps"] >= LIMIT:
        return "done"
    front = view["front"]
    if front[0] == "door" and front[2] == "closed":
        return "toggle"
    grid = view["grid"]
    targets = frontier(grid) | cells(grid, lambda cell: cell[0] == "door" and cell[2] == "closed")
    move = first_move(grid, targets) if targets else None
    if move is None and passable(front) and (5, 3) in targets:
        move = "go forward"
    return move or wander(view, memory)
'''
    )


_NAME = re.compile(
    rf"^(?:(?P<verb>go to|pick up) (?:the|a) (?:(?P<color>{'|'.join(_COLORS)}) )?"
    rf"(?P<type>{'|'.join(_TYPES)})|open (?:the|a) (?:(?P<door>{'|'.join(_COLORS)}) )?door"
    r"|(?P<explore>explore)|(?P<mission>go to|pick up) the object in the mission)$"
)
MISSION_SKILLS: tuple[str, ...] = (
    "go to the object in the mission",
    "pick up the object in the mission",
)
"""The skills that read their object from the mission (`view["mission"]`) at each step."""


def skill_source(name: str) -> str:
    """The source of the skill a name such as "go to the red ball", "pick up a key", "open the
    blue door", "explore" or "go to the object in the mission" stands for.

    Raises:
        ValueError: the name is none of these.
    """
    match = _NAME.match(name)
    if match is None:
        raise ValueError(
            f"no skill is named {name!r}: 'go to the <color> <type>', 'pick up the <color> "
            f"<type>', 'open the <color> door', 'explore', 'go to the object in the mission' or "
            "'pick up the object in the mission'"
        )
    if match["explore"]:
        return explore()
    if match["mission"]:
        return (go_to if match["mission"] == "go to" else pick_up)(None, None, mission=True)
    if match["verb"] is None:
        return open_door(match["door"])
    make = go_to if match["verb"] == "go to" else pick_up
    return make(match["color"], match["type"])
