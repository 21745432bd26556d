"""The GLAM levels: one parametrised BabyAI level, registered under several ids.

:class:`GlamLevel` draws, at every reset and from the env's seeded generator, a task type among
those it was given, then builds a room and an instruction of that type. The registered
configurations (see ``babyai_text/registration.py``) differ only in their keyword arguments.

GLAM drew the task type once per env instance, before seeding, so every env kept one task for
life and the mix did not follow the seed. Here the draw is part of the episode: the same seed
gives the same task type, room, mission and descriptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from minigrid.core.constants import COLOR_NAMES
from minigrid.core.roomgrid import RoomGrid
from minigrid.core.world_object import WorldObj
from minigrid.envs.babyai.core.roomgrid_level import RejectSampling, RoomGridLevel
from minigrid.envs.babyai.core.verifier import (
    ActionInstr,
    AfterInstr,
    AndInstr,
    BeforeInstr,
    GoToInstr,
    Instr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

from babyai_text.describe import LANGUAGES, translate_mission

__all__ = [
    "HELD_OUT_PAIRS",
    "SPLITS",
    "TASK_TYPES",
    "GlamLevel",
    "mentioned_pairs",
    "task_type_of",
]

TASK_TYPES: tuple[str, ...] = (
    "goto",
    "pickup",
    "putnext",
    "open",
    "pickup_then_goto",
    "goto_after_pickup",
    "pickup_then_pickup",
)
"""Task types :class:`GlamLevel` can build.

``pickup_then_goto`` reads "pick up X, then go to Y", ``goto_after_pickup`` "go to Y after you
pick up X" (the same task in its two phrasings), ``pickup_then_pickup`` "pick up X, then pick
up Y"."""

HELD_OUT_PAIRS: frozenset[tuple[str, str]] = frozenset(
    {("yellow", "box"), ("red", "key"), ("red", "door"), ("green", "ball"), ("grey", "door")}
)
"""(colour, type) pairs that training instructions never mention and test instructions always
do."""

SPLITS: tuple[str | None, ...] = (None, "train", "test")
"""``"train"``: reject instructions mentioning a held-out pair; ``"test"``: reject the others."""

_ACTION_TASK_TYPES = {
    GoToInstr: "goto",
    PickupInstr: "pickup",
    PutNextInstr: "putnext",
    OpenInstr: "open",
}


def task_type_of(instr: Instr | None) -> str | None:
    """Task type of a BabyAI instruction, or None when it is not one of the simple shapes.

    Single actions give ``goto``, ``pickup``, ``putnext`` or ``open``; two actions in sequence
    give ``{a}_then_{b}`` ("a, then b") or ``{a}_after_{b}`` ("a after you b"), and joined by
    "and" ``{a}_and_{b}``. Deeper nestings (as in BossLevel) give None.
    """
    if isinstance(instr, ActionInstr):
        return _ACTION_TASK_TYPES.get(type(instr))
    joiners = ((BeforeInstr, "then"), (AfterInstr, "after"), (AndInstr, "and"))
    for instr_class, joiner in joiners:
        if isinstance(instr, instr_class):
            first, second = instr.instr_a, instr.instr_b
            if isinstance(first, ActionInstr) and isinstance(second, ActionInstr):
                first_type, second_type = task_type_of(first), task_type_of(second)
                if first_type and second_type:
                    return f"{first_type}_{joiner}_{second_type}"
    return None


def mentioned_pairs(instr: Instr) -> set[tuple[str | None, str | None]]:
    """The (colour, type) of every object description an instruction refers to."""
    if isinstance(instr, (BeforeInstr, AfterInstr, AndInstr)):
        return mentioned_pairs(instr.instr_a) | mentioned_pairs(instr.instr_b)
    descs = [getattr(instr, name, None) for name in ("desc", "desc_move", "desc_fixed")]
    return {(desc.color, desc.type) for desc in descs if desc is not None}


def _desc(obj: WorldObj) -> ObjDesc:
    return ObjDesc(obj.type, obj.color)


class GlamLevel(RoomGridLevel):
    """
    ## Description

    One 8x8 room with 8 objects (keys, balls, boxes of random colours, possibly repeated) and
    one instruction; with ``distractors=n``, the objects the task needs plus n others (n = 0:
    BALROG's setting, one object to go to, two to put next to each other). At each reset a task type is drawn, with the given weights, from the env's
    seeded generator:

    - ``goto``, ``pickup``: go to / pick up one of the objects (as `BabyAI-GoToLocal-v0`);
    - ``putnext``: put one object next to another (all objects distinct, as
      `BabyAI-PutNextLocal-v0`);
    - ``pickup_then_goto``, ``goto_after_pickup``, ``pickup_then_pickup``: two actions on two
      different objects, in sequence;
    - ``open``: two 8x8 rooms side by side; the agent starts in the left one with 8 objects,
      one of them the key of the locked door between the rooms.

    A ``"train"`` split rejects (and redraws) every room whose instruction mentions a held-out
    pair (yellow box, red key, red door, green ball, grey door), so train doors are yellow,
    green, blue or purple; a ``"test"`` split keeps only those instructions. The task type of
    the current episode is ``env.unwrapped.task_type``.

    ## Mission Space

    - "go to the {color} {type}", "pick up the {color} {type}"
    - "put the {color} {type} next to the {color} {type}"
    - "open the {color} door"
    - "pick up the {color} {type}, then go to the {color} {type}"
    - "go to the {color} {type} after you pick up the {color} {type}"
    - "pick up the {color} {type}, then pick up the {color} {type}"

    "a" replaces "the" when several objects fit the description. {color} is one of "red",
    "green", "blue", "purple", "yellow", "grey"; {type} one of "ball", "box", "key". With
    ``language="fr"`` the mission is French ("va à la balle rouge"), see
    :func:`babyai_text.describe.translate_mission`.

    ## Action Space

    | Num | Name         | Action            |
    |-----|--------------|-------------------|
    | 0   | left         | Turn left         |
    | 1   | right        | Turn right        |
    | 2   | forward      | Move forward      |
    | 3   | pickup       | Pick up an object |
    | 4   | drop         | Drop an object    |
    | 5   | toggle       | Open/unlock door  |
    | 6   | done         | Unused            |

    ## Rewards

    A reward of '1 - 0.9 * (step_count / max_steps)' is given for success, and '0' for failure.
    ``max_steps`` is BabyAI's: 64 per navigation per room, that is 64 for goto and pickup,
    128 for putnext, the sequences and open (two rooms).

    ## Termination

    The episode ends if any one of the following conditions is met:

    1. The agent completes the instruction.
    2. Timeout (see `max_steps`).

    ## Registered Configurations

    - `BabyAI-MixedTrainLocal-v0`: the training mix (goto, pickup, putnext, open, pick up then
      go to in both phrasings), no held-out pair.
    - `BabyAI-MixedTestLocal-v0`: the same mix, held-out pairs only.
    - `BabyAI-PickUpSeqPickUpLocal-v0`: "pick up X, then pick up Y".
    - `BabyAI-PickUpThenGoToLocal-v0`: "pick up X, then go to Y".
    - `BabyAI-GoToAfterPickUpLocal-v0`: "go to Y after you pick up X".
    - `BabyAI-GoToLocalFrench-v0`: goto, mission in French.
    """

    def __init__(
        self,
        tasks: Mapping[str, float] | Sequence[str] = ("goto",),
        split: str | None = None,
        language: str = "en",
        room_size: int = 8,
        num_dists: int = 8,
        distractors: int | None = None,
        max_tries: int = 1000,
        **kwargs,
    ) -> None:
        """
        Args:
            tasks: task types to draw from, with weights (a mapping) or evenly (a sequence).
            split: None, ``"train"`` (no held-out pair) or ``"test"`` (a held-out pair).
            language: language of the mission, ``"en"`` or ``"fr"``.
            room_size: side of each room, walls included.
            num_dists: number of objects in the agent's room, whatever the task.
            distractors: when given, replaces ``num_dists``: objects in the agent's room besides
                those the task needs (the one object of goto and pickup, the two of putnext and
                the sequences, the key of open), as ``num_dists`` counts them in the original
                BabyAI-Text levels and in BALROG's configuration (``num_dists: 0``).
            max_tries: rooms drawn at most per reset before giving up.
            **kwargs: passed to ``RoomGridLevel`` (``max_steps``, ``render_mode``...).
        """
        weights = dict(tasks) if isinstance(tasks, Mapping) else dict.fromkeys(tasks, 1.0)
        unknown = sorted(set(weights) - set(TASK_TYPES))
        if unknown or not weights:
            raise ValueError(f"unknown task types {unknown or tasks!r}; known: {TASK_TYPES}")
        if any(w <= 0 for w in weights.values()):
            raise ValueError(f"task weights must be positive, got {weights}")
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; known splits: {SPLITS}")
        if language not in LANGUAGES:
            raise ValueError(f"unknown language {language!r}; known languages: {LANGUAGES}")
        if num_dists < 2:
            raise ValueError(f"num_dists must be at least 2, got {num_dists}")
        if distractors is not None and distractors < 0:
            raise ValueError(f"distractors must be >= 0, got {distractors}")

        self.task_types = tuple(weights)
        total = sum(weights.values())
        self.task_probs = tuple(w / total for w in weights.values())
        self.split = split
        self.language = language
        self.num_dists = num_dists
        self.distractors = distractors
        self.max_tries = max_tries
        self.task_type: str | None = None
        """Task type of the current episode (None before the first reset)."""
        num_cols = 2 if "open" in self.task_types else 1
        super().__init__(num_rows=1, num_cols=num_cols, room_size=room_size, **kwargs)

    def _gen_grid(self, width: int, height: int) -> None:
        # Replaces RoomGridLevel._gen_grid to draw the task type once per episode, to resize the
        # grid for it, and to redraw rejected rooms without printing.
        self.task_type = self.task_types[
            self.np_random.choice(len(self.task_types), p=self.task_probs)
        ]
        self.num_cols = 2 if self.task_type == "open" else 1
        self.width = (self.room_size - 1) * self.num_cols + 1
        for _ in range(self.max_tries):
            RoomGrid._gen_grid(self, self.width, height)
            try:
                self.gen_mission()
                self.validate_instrs(self.instrs)
                self._check_split(self.instrs)
            except (RejectSampling, RecursionError):
                continue
            break
        else:
            raise RuntimeError(
                f"no valid {self.task_type!r} room in {self.max_tries} tries (split={self.split!r})"
            )
        self.surface = self.instrs.surface(self)
        self.mission = translate_mission(self.surface, self.language)

    def _check_split(self, instr: Instr) -> None:
        if self.split is None:
            return
        held_out = bool(mentioned_pairs(instr) & HELD_OUT_PAIRS)
        if held_out != (self.split == "test"):
            raise RejectSampling(f"instruction does not fit the {self.split} split")

    def _objects(self) -> int:
        """Objects to place in the agent's room for the current task type."""
        if self.distractors is None:
            return self.num_dists
        needed = 1 if self.task_type in ("goto", "pickup", "open") else 2
        return needed + self.distractors

    def gen_mission(self) -> None:
        """Build the room and ``self.instrs`` for ``self.task_type``."""
        if self.task_type == "open":
            self.instrs = self._gen_open()
            return

        self.place_agent()
        # PutNext needs distinct objects or "put the red ball next to a red ball" is ambiguous.
        objs = self.add_distractors(
            num_distractors=self._objects(), all_unique=self.task_type == "putnext"
        )
        self.check_objs_reachable()
        if self.task_type == "goto":
            self.instrs = GoToInstr(_desc(self._rand_elem(objs)))
        elif self.task_type == "pickup":
            self.instrs = PickupInstr(_desc(self._rand_elem(objs)))
        else:
            first, second = self._rand_subset(objs, 2)
            if (first.type, first.color) == (second.type, second.color):
                raise RejectSampling("both objects answer the same description")
            if self.task_type == "putnext":
                self.instrs = PutNextInstr(_desc(first), _desc(second))
            elif self.task_type == "pickup_then_goto":
                self.instrs = BeforeInstr(PickupInstr(_desc(first)), GoToInstr(_desc(second)))
            elif self.task_type == "goto_after_pickup":
                self.instrs = AfterInstr(GoToInstr(_desc(second)), PickupInstr(_desc(first)))
            elif self.task_type == "pickup_then_pickup":
                self.instrs = BeforeInstr(PickupInstr(_desc(first)), PickupInstr(_desc(second)))
            else:
                raise AssertionError(f"unhandled task type {self.task_type!r}")

    def _gen_open(self) -> OpenInstr:
        # Any colour may be drawn; the split check keeps train doors off red and grey.
        color = self._rand_elem(COLOR_NAMES)
        self.add_door(0, 0, door_idx=0, color=color, locked=True)
        self.place_agent(0, 0)
        self.add_object(0, 0, "key", color)
        self.add_distractors(0, 0, num_distractors=self._objects() - 1, all_unique=False)
        # Also rejects rooms where an object blocks the way to the door.
        self.check_objs_reachable()
        return OpenInstr(ObjDesc("door", color))
