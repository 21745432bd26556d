"""From what the agent sees to sentences: BabyAI-Text's observations, in English and French.

The input is minigrid's egocentric view, encoded the way ``MiniGridEnv.gen_obs`` returns it in
``obs["image"]``: an array of shape ``(view, view, 3)`` indexed ``[x, y]``, each cell holding
``(object index, colour index, state)``, cells the agent cannot see set to "unseen". The agent
stands at the bottom centre ``(view // 2, view - 1)`` facing up (towards ``y = 0``), and minigrid
writes the object it carries into its own cell.

Sentences come in this order (GLAM's wording, with "an open door" where GLAM printed "a open"):

1. what the agent carries: ``You carry a red ball``;
2. walls on the three straight lines forward, left and right, only when nothing stands between:
   ``You see a wall 2 steps forward``, ``You see a wall 1 step left``;
3. every other visible object, column by column from the left, top to bottom within a column:
   ``You see a red ball 1 step left and 2 steps forward``,
   ``You see a locked red door 3 steps forward``.

The French wording (``language="fr"``) is ``Tu portes une clé verte``,
``Tu vois un mur à 2 pas devant``, ``Tu vois une balle rouge à 1 pas à gauche et à 2 pas devant``,
``Tu vois une porte rouge verrouillée à 3 pas devant``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, OBJECT_TO_IDX

if TYPE_CHECKING:
    import gymnasium as gym

__all__ = [
    "LANGUAGES",
    "definite_noun_phrase",
    "describe_env",
    "describe_view",
    "translate_mission",
]

LANGUAGES: tuple[str, ...] = ("en", "fr")
"""Languages the descriptions and missions can be written in."""

_UNSEEN = OBJECT_TO_IDX["unseen"]
_EMPTY = OBJECT_TO_IDX["empty"]
_WALL = OBJECT_TO_IDX["wall"]
_DOOR = OBJECT_TO_IDX["door"]
_DOOR_STATES = {0: "open", 1: "closed", 2: "locked"}

# French nouns with their grammatical gender ("f" or "m").
_FR_NOUNS: dict[str, tuple[str, str]] = {
    "key": ("clé", "f"),
    "ball": ("balle", "f"),
    "box": ("boîte", "f"),
    "door": ("porte", "f"),
    "wall": ("mur", "m"),
    "object": ("objet", "m"),
    "goal": ("but", "m"),
    "lava": ("lave", "f"),
    "floor": ("sol", "m"),
}
# French adjectives (colours and door states): (masculine, feminine).
_FR_ADJECTIVES: dict[str, tuple[str, str]] = {
    "red": ("rouge", "rouge"),
    "green": ("vert", "verte"),
    "blue": ("bleu", "bleue"),
    "purple": ("violet", "violette"),
    "yellow": ("jaune", "jaune"),
    "grey": ("gris", "grise"),
    "open": ("ouvert", "ouverte"),
    "closed": ("fermé", "fermée"),
    "locked": ("verrouillé", "verrouillée"),
}
_FR_DIRECTIONS = {"forward": "devant", "left": "à gauche", "right": "à droite"}


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"unknown language {language!r}; known languages: {LANGUAGES}")


def _noun_phrase(obj_type: str, color: str | None, state: str | None, language: str) -> str:
    """Indefinite noun phrase: ``a red ball``, ``an open red door``, ``une porte rouge ouverte``."""
    if language == "fr":
        noun, gender = _FR_NOUNS[obj_type]
        form = 1 if gender == "f" else 0
        adjectives = [_FR_ADJECTIVES[a][form] for a in (color, state) if a is not None]
        return " ".join(["une" if gender == "f" else "un", noun, *adjectives])
    words = [w for w in (state, color, obj_type) if w is not None]
    article = "an" if words[0][0] in "aeiou" else "a"
    return " ".join([article, *words])


def definite_noun_phrase(obj_type: str, color: str | None, language: str) -> str:
    """Definite noun phrase: ``the red ball``, ``the wall``; ``la balle rouge``, ``le mur``."""
    if language == "fr":
        noun, gender = _FR_NOUNS[obj_type]
        article = "l'" if noun[0] in "aeiouéh" else ("la " if gender == "f" else "le ")
        color_word = f" {_FR_ADJECTIVES[color][1 if gender == 'f' else 0]}" if color else ""
        return f"{article}{noun}{color_word}"
    return " ".join(w for w in ("the", color, obj_type) if w is not None)


def _distance(steps: int, direction: str, language: str) -> str:
    """``2 steps forward``, ``1 step left``; ``à 2 pas devant``, ``à 1 pas à gauche``."""
    if language == "fr":
        return f"à {steps} pas {_FR_DIRECTIONS[direction]}"
    return f"{steps} step{'' if steps == 1 else 's'} {direction}"


def _where(dx: int, dy: int, language: str) -> str:
    """Position of a cell ``dx`` to the right and ``dy`` forward of the agent, in words."""
    parts = []
    if dx != 0:
        parts.append(_distance(abs(dx), "right" if dx > 0 else "left", language))
    if dy != 0 or dx == 0:
        parts.append(_distance(dy, "forward", language))
    return (" et " if language == "fr" else " and ").join(parts)


def _cell_words(cell: np.ndarray) -> tuple[str, str | None, str | None]:
    """(type, colour, door state or None) of an encoded cell."""
    type_idx, color_idx, state_idx = (int(v) for v in cell)
    if type_idx not in IDX_TO_OBJECT or color_idx not in IDX_TO_COLOR:
        raise ValueError(f"cell {tuple(cell)} is not a minigrid encoding")
    obj_type = IDX_TO_OBJECT[type_idx]
    if obj_type == "wall":
        return obj_type, None, None
    state = _DOOR_STATES.get(state_idx) if type_idx == _DOOR else None
    if type_idx == _DOOR and state is None:
        raise ValueError(f"cell {tuple(cell)}: door state {state_idx} is not 0, 1 or 2")
    return obj_type, IDX_TO_COLOR[color_idx], state


def _check_image(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if (
        image.ndim != 3
        or image.shape[2] != 3
        or image.shape[0] != image.shape[1]
        or image.shape[0] % 2 == 0
    ):
        raise ValueError(
            "expected minigrid's encoded egocentric view of shape (view, view, 3) with an odd "
            f"view size, got an array of shape {image.shape}"
        )
    return image


def describe_view(image: np.ndarray, language: str = "en") -> list[str]:
    """Describe the agent's egocentric view in sentences (see the module docstring).

    Args:
        image: minigrid's encoded view, ``obs["image"]`` or ``grid.encode(vis_mask)`` of
            ``env.gen_obs_grid()``: shape ``(view, view, 3)``, indexed ``[x, y]``, agent at
            ``(view // 2, view - 1)`` facing ``y = 0``, carried object in the agent's cell.
        language: ``"en"`` or ``"fr"``.

    Returns:
        The sentences, carried object first, then walls (forward, left, right), then the other
        objects from the leftmost column to the rightmost, top to bottom.
    """
    _check_language(language)
    image = _check_image(image)
    size = image.shape[0]
    agent_x, agent_y = size // 2, size - 1
    you_see, you_carry = ("Tu vois", "Tu portes") if language == "fr" else ("You see", "You carry")
    sentences = []

    carried = image[agent_x, agent_y]
    if carried[0] not in (_UNSEEN, _EMPTY):
        sentences.append(f"{you_carry} {_noun_phrase(*_cell_words(carried), language)}")

    # Walls: walk each straight line outwards; the first thing met is a wall or hides it.
    lines = {
        (0, 1): [image[agent_x, y] for y in range(agent_y - 1, -1, -1)],
        (-1, 0): [image[x, agent_y] for x in range(agent_x - 1, -1, -1)],
        (1, 0): [image[x, agent_y] for x in range(agent_x + 1, size)],
    }
    for (sign_x, forward), cells in lines.items():
        for steps, cell in enumerate(cells, start=1):
            if cell[0] in (_UNSEEN, _EMPTY):
                continue
            if cell[0] == _WALL:
                where = _where(sign_x * steps, forward * steps, language)
                sentences.append(f"{you_see} {_noun_phrase('wall', None, None, language)} {where}")
            break

    for x in range(size):
        for y in range(size):
            if (x, y) == (agent_x, agent_y) or image[x, y, 0] in (_UNSEEN, _EMPTY, _WALL):
                continue
            phrase = _noun_phrase(*_cell_words(image[x, y]), language)
            sentences.append(f"{you_see} {phrase} {_where(x - agent_x, agent_y - y, language)}")
    return sentences


def describe_env(env: gym.Env, language: str = "en") -> list[str]:
    """Describe what the agent of a minigrid env (or a wrapper of one) sees right now."""
    grid, vis_mask = env.unwrapped.gen_obs_grid()
    return describe_view(grid.encode(vis_mask), language)


# --- Missions ----------------------------------------------------------------------------------

_COLORS = "red|green|blue|purple|yellow|grey"
_DESC = re.compile(
    rf"^(?P<article>the|a) (?:(?P<color>{_COLORS}) )?(?P<type>box|ball|key|door|object)"
    r"(?P<loc> in front of you| behind you| on your left| on your right)?$"
)
_FR_LOCATIONS = {
    " in front of you": " devant toi",
    " behind you": " derrière toi",
    " on your left": " à ta gauche",
    " on your right": " à ta droite",
}
# Each French verb in the imperative ("ramasse X") and the past infinitive ("avoir ramassé X").
_FR_IMPERATIVE = {"goto": "va", "pickup": "ramasse", "open": "ouvre", "put": "mets"}
_FR_PAST = {
    "goto": "être allé",
    "pickup": "avoir ramassé",
    "open": "avoir ouvert",
    "put": "avoir mis",
}


def _fr_object(desc: str, mission: str, preposition: str = "") -> str:
    """French for a BabyAI object description, after ``preposition`` ("", "à" or "de")."""
    match = _DESC.match(desc)
    if match is None:
        raise ValueError(f"cannot translate mission {mission!r}: {desc!r} is not an object")
    noun, gender = _FR_NOUNS[match["type"]]
    form = 1 if gender == "f" else 0
    color = f" {_FR_ADJECTIVES[match['color']][form]}" if match["color"] else ""
    location = _FR_LOCATIONS[match["loc"]] if match["loc"] else ""
    if match["article"] == "a":
        article = "une " if gender == "f" else "un "
        if preposition == "de":
            preposition = "d'"
    elif noun[0] in "aeiouéh":
        article = "l'"
    elif gender == "f":
        article = "la "
    elif preposition in ("à", "de"):  # à le -> au, de le -> du
        article, preposition = {"à": "au ", "de": "du "}[preposition], ""
    else:
        article = "le "
    if preposition and not preposition.endswith("'"):
        preposition += " "
    return f"{preposition}{article}{noun}{color}{location}"


def _fr_action(clause: str, mission: str, past: bool) -> str:
    """French for one BabyAI action clause, imperative or (``past``) past infinitive."""
    verbs = _FR_PAST if past else _FR_IMPERATIVE
    for prefix, verb, preposition in (
        ("go to ", "goto", "à"),
        ("pick up ", "pickup", ""),
        ("open ", "open", ""),
    ):
        if clause.startswith(prefix):
            obj = _fr_object(clause[len(prefix) :], mission, preposition)
            return f"{verbs[verb]} {obj}"
    if clause.startswith("put ") and " next to " in clause:
        moved, fixed = clause[len("put ") :].split(" next to ", 1)
        moved_fr = _fr_object(moved, mission)
        fixed_fr = _fr_object(fixed, mission, "de")
        return f"{verbs['put']} {moved_fr} à côté {fixed_fr}"
    raise ValueError(f"cannot translate mission {mission!r}: unknown clause {clause!r}")


def _fr_conjunction(text: str, mission: str, past: bool) -> str:
    return " et ".join(_fr_action(clause, mission, past) for clause in text.split(" and "))


def _mission_to_french(mission: str) -> str:
    if ", then " in mission:
        first, second = mission.split(", then ", 1)
        return (
            f"{_fr_conjunction(first, mission, False)}, puis "
            f"{_fr_conjunction(second, mission, False)}"
        )
    if " after you " in mission:
        first, second = mission.split(" after you ", 1)
        return (
            f"{_fr_conjunction(first, mission, False)} après "
            f"{_fr_conjunction(second, mission, True)}"
        )
    return _fr_conjunction(mission, mission, False)


def translate_mission(mission: str, language: str) -> str:
    """Translate a BabyAI mission (minigrid's English surface form) into ``language``.

    English is returned unchanged. French covers BabyAI's grammar: go to / pick up / open /
    put ... next to, joined by "and", ", then" and "after you", objects with "the"/"a", an
    optional colour and an optional location: ``go to the red ball`` -> ``va à la balle rouge``,
    ``pick up a blue key, then go to the grey box`` ->
    ``ramasse une clé bleue, puis va à la boîte grise``.

    Raises:
        ValueError: for an unknown language or a mission outside BabyAI's grammar.
    """
    _check_language(language)
    if language == "en":
        return mission
    return _mission_to_french(mission)
