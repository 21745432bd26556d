"""The API a coded action sees.

A coded action is Python source that defines

    def step(view, memory):
        ...
        return "go forward"

`step` is called once per primitive step while the coded action runs. It returns the primitive
action to take now, one of `view["actions"]` (e.g. "turn left", "turn right", "go forward",
"pick up", "drop", "toggle"), or "done" when the coded action has finished. The coded action
also stops when the episode ends, when it has taken its maximum number of primitive steps, or
at its first error.

`view` is read-only plain data about what the agent perceives now:

- `view["mission"]`: the mission, e.g. "go to the red ball".
- `view["grid"]`: what the agent sees, 7 rows of 7 cells, egocentric: `view["grid"][row][col]`,
  row 0 the farthest ahead, row 6 the agent's own row; col 0 the leftmost, col 6 the rightmost.
  The agent is at row 6, col 3 (`AGENT_ROW`, `AGENT_COL`), facing row 0: the cell in front of
  it is `grid[5][3]`, the cell to its left `grid[6][2]`, to its right `grid[6][4]`. The agent's
  own cell shows what it carries (or "empty").
  Each cell is a tuple `(type, color, state)`:
  - type: "unseen" (hidden behind a wall or a closed door), "empty", "wall", "door", "key",
    "ball", "box" (also "goal", "lava", "floor" in some levels);
  - color: "red", "green", "blue", "purple", "yellow", "grey"; "" for unseen and empty cells;
  - state: for a door "open", "closed" or "locked"; "" for anything else.
- `view["front"]`: the cell in front of the agent, `(type, color, state)` as above.
- `view["carrying"]`: `(type, color)` of the object the agent carries, or None.
- `view["direction"]`: where the agent faces in the room: "east", "south", "west" or "north".
- `view["position"]`: `(x, y)`, the agent's cell in the whole level (x grows eastwards, y
  southwards); useful to remember places in `memory`.
- `view["descriptions"]`: sentences describing the view, e.g. "You see a red ball 2 steps
  forward".
- `view["actions"]`: the primitive actions `step` may return (besides "done").
- `view["steps"]`: primitive steps this execution of the coded action has taken so far (0 at
  the first call).

`memory` is a dict, empty at the start of each execution of the coded action, kept across the
calls of that execution and then discarded. It may hold plain data only: None, booleans,
numbers, strings, and tuples, lists, sets and dicts of them.

The language is a restricted Python: no `import`, no classes, no names or attributes starting
with "_", no `open`, `eval`, `exec`, `globals`, `getattr`; builtins such as `len`, `range`,
`min`, `max`, `sorted`, `enumerate`, `zip`, `abs`, `math` are there; `print` prints nothing.
Each call may run at most 10000 lines and take at most 1 second (the sandbox's defaults).

Example: walk forward until something is in front, then stop.

    def step(view, memory):
        if view["front"][0] == "empty":
            return "go forward"
        return "done"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

__all__ = ["AGENT_COL", "AGENT_ROW", "DIRECTIONS", "build_view"]

AGENT_ROW, AGENT_COL = 6, 3
"""The agent's cell in `view["grid"]` (minigrid's 7x7 view)."""
DIRECTIONS: tuple[str, ...] = ("east", "south", "west", "north")
"""`view["direction"]` by minigrid's `agent_dir` (0 faces +x, 1 faces +y, ...)."""

_OBJECTS = {index: name for name, index in OBJECT_TO_IDX.items()}
_COLORS = {index: name for name, index in COLOR_TO_IDX.items()}
_STATES = {index: name for name, index in STATE_TO_IDX.items()}
_COLORLESS = ("unseen", "empty")


def build_view(
    env: Any, obs: dict[str, Any], info: dict[str, Any], actions: Sequence[str], steps: int
) -> dict[str, Any]:
    """The view of the module docstring, as plain data.

    Args:
        env: the minigrid env (`unwrapped`: position, carried object).
        obs: the text env's last observation (`image`, `mission`, `direction`).
        info: the text env's last info (`descriptions`).
        actions: the primitive words a coded action may return.
        steps: primitive steps the current execution has taken.
    """
    image = obs["image"]  # (x, y, 3) as minigrid encodes it: [col][row]
    width, height = image.shape[0], image.shape[1]
    grid = tuple(
        tuple(_cell(*(int(value) for value in image[col, row])) for col in range(width))
        for row in range(height)
    )
    base = env.unwrapped
    carrying = base.carrying
    return {
        "mission": obs["mission"],
        "grid": grid,
        "front": grid[height - 2][width // 2],
        "carrying": None if carrying is None else (carrying.type, carrying.color),
        "direction": DIRECTIONS[int(obs["direction"])],
        "position": (int(base.agent_pos[0]), int(base.agent_pos[1])),
        "descriptions": tuple(info.get("descriptions", ())),
        "actions": tuple(actions),
        "steps": steps,
    }


def _cell(kind: int, color: int, state: int) -> tuple[str, str, str]:
    name = _OBJECTS[kind]
    if name in _COLORLESS:
        return (name, "", "")
    return (name, _COLORS[color], _STATES[state] if name == "door" else "")
