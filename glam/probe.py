"""GLAM's action-probability probe: fixed situations, the action that is right in each, and how
much of its probability the policy gives that action as training goes on.

Each situation is one step of a BabyAI task (go to, pick up, put next to, open): a mission and
what the agent sees, written as a small egocentric scene (objects so many steps left/right and
forward) and turned into sentences by BabyAI-Text's own describer (`babyai_text.describe`), so
the observation reads exactly as the env would write it, in English or French. The prompt is
then built by `PromptHistory.prompt`, as at the first step of an episode, with the run's prompt
format, language and action words. Each right action is a minigrid action (`left`, `pickup`...)
and is shown in the words of the run's action space; a situation whose right action the space
lacks (picking up with the navigation actions) is left out.

The right actions follow BabyAI's success rules: "go to X" is done when X is in the cell in front
of the agent, "pick up" takes the object in front, "put A next to B" drops A in front, and the
drop counts when that cell is beside B (not diagonally), "toggle" opens a closed door in front,
or a locked one when the agent carries the key of its colour. The colour-type pairs held out by
`BabyAI-MixedTestLocal-v0` (yellow box, red key, red door, green ball, grey door) appear in no
situation.

    probe = ActionProbe(run_dir, cfg.train.probe_every, cfg.env, cfg.policy, tokenizer,
                        enabled=accelerator.is_main_process)
    metrics |= probe.after_update(update, model)       # every process: a collective forward

In a training run, `train.probe_every=K` adds `ProbeHook` to the trainer's hooks
(`scripts/train_language_agent.py`): probed at update 0 (a fresh run) and every K updates.

`probe.csv` (main process) gets one row per update, situation and candidate action: `update`,
`probe`, `task_type`, `action`, `probability`, `is_right`. `scripts/plot_probe.py` draws it.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from minigrid.core.actions import Actions
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX

from babyai_text import ActionSpace, get_action_space
from babyai_text.describe import describe_view, translate_mission
from glam.config import EnvConfig, PolicyConfig
from glam.policy.prompts import PromptHistory
from glam.ppo.hooks import TrainerHook

if TYPE_CHECKING:
    from glam.ppo.setup import Training

__all__ = [
    "PROBE_CSV",
    "PROBE_COLUMNS",
    "SITUATIONS",
    "ActionProbe",
    "Probe",
    "ProbeHook",
    "Seen",
    "Situation",
    "build_probes",
    "describe_scene",
    "wall_row",
]

PROBE_CSV = "probe.csv"
PROBE_COLUMNS = ("update", "probe", "task_type", "action", "probability", "is_right")
"""One row per update, situation and candidate action."""
VIEW_SIZE = 7
"""BabyAI's egocentric view: 7x7 cells, the agent at the bottom centre facing up."""


@dataclass(frozen=True)
class Seen:
    """Something the agent sees: `dx` steps to its right (negative: left), `dy` forward."""

    type: str
    """minigrid object type: `ball`, `key`, `box`, `door` or `wall`."""
    color: str
    """minigrid colour (walls are grey)."""
    dx: int
    dy: int
    state: str | None = None
    """Doors only: `open`, `closed` or `locked`."""


def wall_row(dy: int, *doors: Seen) -> tuple[Seen, ...]:
    """A wall across the whole view `dy` steps forward, with `doors` in it."""
    door_cells = {door.dx for door in doors}
    half = VIEW_SIZE // 2
    walls = tuple(
        Seen("wall", "grey", dx, dy) for dx in range(-half, half + 1) if dx not in door_cells
    )
    return walls + doors


@dataclass(frozen=True)
class Situation:
    """One hand-written probe situation and the action that is right in it."""

    id: str
    task_type: str
    mission: str
    """In English, minigrid's wording (translated for a French run)."""
    seen: tuple[Seen, ...]
    right_action: str
    """minigrid action name (`left`, `right`, `forward`, `pickup`, `drop`, `toggle`)."""
    why: str
    """Why that action, and no other, is right."""
    carrying: tuple[str, str] | None = None
    """(type, colour) of what the agent carries."""


SITUATIONS: tuple[Situation, ...] = (
    Situation(
        "goto-ahead",
        "goto",
        "go to the red ball",
        (Seen("ball", "red", 0, 3), Seen("key", "blue", -2, 1)),
        "forward",
        "the ball is straight ahead, 3 steps: walk up to it",
    ),
    Situation(
        "goto-left",
        "goto",
        "go to the green key",
        (Seen("key", "green", -2, 0), Seen("box", "purple", 1, 2)),
        "left",
        "the key is level with the agent on its left: face it",
    ),
    Situation(
        "goto-right-wall-ahead",
        "goto",
        "go to the blue box",
        (*wall_row(1), Seen("ball", "yellow", -2, 0), Seen("box", "blue", 3, 0)),
        "right",
        "a wall ahead, the box level on the right (the ball on the left is another object)",
    ),
    Situation(
        "goto-left-other-ahead",
        "goto",
        "go to the grey ball",
        (Seen("key", "grey", 0, 2), Seen("ball", "grey", -1, 0)),
        "left",
        "the ball is right beside the agent on its left; ahead is a key, not the goal",
    ),
    Situation(
        "pickup-in-front",
        "pickup",
        "pick up the blue key",
        (Seen("key", "blue", 0, 1), Seen("ball", "purple", 2, 3)),
        "pickup",
        "the key is in the cell in front",
    ),
    Situation(
        "pickup-right-other-in-front",
        "pickup",
        "pick up the yellow ball",
        (Seen("key", "yellow", 0, 1), Seen("ball", "yellow", 2, 0)),
        "right",
        "the object in front is a key; the ball is level on the right",
    ),
    Situation(
        "pickup-ahead",
        "pickup",
        "pick up the purple box",
        (Seen("box", "purple", 0, 3),),
        "forward",
        "the box is straight ahead, 3 steps",
    ),
    Situation(
        "pickup-left",
        "pickup",
        "pick up the blue ball",
        (Seen("ball", "blue", -1, 0), Seen("box", "green", 1, 4)),
        "left",
        "the ball is right beside the agent on its left",
    ),
    Situation(
        "putnext-pick-first",
        "putnext",
        "put the purple key next to the blue ball",
        (Seen("key", "purple", 0, 1), Seen("ball", "blue", 2, 3)),
        "pickup",
        "the key to move is in front and the agent carries nothing",
    ),
    Situation(
        "putnext-drop",
        "putnext",
        "put the purple key next to the blue ball",
        (Seen("ball", "blue", 0, 2),),
        "drop",
        "a drop puts the key in front, 1 step forward, beside the ball 2 steps forward",
        carrying=("key", "purple"),
    ),
    Situation(
        "putnext-approach",
        "putnext",
        "put the purple key next to the blue ball",
        (Seen("ball", "blue", 0, 4),),
        "forward",
        "the ball is 4 steps ahead: a drop here would land 3 cells from it",
        carrying=("key", "purple"),
    ),
    Situation(
        "putnext-turn",
        "putnext",
        "put the green box next to the yellow key",
        (Seen("key", "yellow", -3, 0),),
        "left",
        "the key is level on the left: face it before walking up to it",
        carrying=("box", "green"),
    ),
    Situation(
        "open-in-front",
        "open",
        "open the yellow door",
        wall_row(1, Seen("door", "yellow", 0, 1, "closed")),
        "toggle",
        "the closed door is in front",
    ),
    Situation(
        "open-ahead",
        "open",
        "open the purple door",
        wall_row(3, Seen("door", "purple", 0, 3, "closed")),
        "forward",
        "the door is straight ahead, 3 steps: walk up to it",
    ),
    Situation(
        "open-locked-with-key",
        "open",
        "open the green door",
        wall_row(1, Seen("door", "green", 0, 1, "locked")),
        "toggle",
        "the locked door is in front and the agent carries its key",
        carrying=("key", "green"),
    ),
    Situation(
        "open-left",
        "open",
        "open the blue door",
        wall_row(1, Seen("door", "blue", -2, 1, "closed")),
        "left",
        "a wall in front, the door in it 2 steps to the left: turn left to walk along the wall",
    ),
)
"""The probe situations, four per task type."""


def describe_scene(
    seen: Sequence[Seen], carrying: tuple[str, str] | None = None, language: str = "en"
) -> list[str]:
    """The sentences BabyAI-Text writes for this view (every other cell is empty floor)."""
    half = VIEW_SIZE // 2
    agent_x, agent_y = half, VIEW_SIZE - 1
    image = np.zeros((VIEW_SIZE, VIEW_SIZE, 3), dtype=np.uint8)
    image[..., 0] = OBJECT_TO_IDX["empty"]
    for thing in seen:
        inside = -half <= thing.dx <= half and 0 <= thing.dy < VIEW_SIZE
        if not inside or (thing.dx, thing.dy) == (0, 0):
            raise ValueError(f"{thing} is outside the {VIEW_SIZE}x{VIEW_SIZE} view or on the agent")
        state = STATE_TO_IDX[thing.state] if thing.state else 0
        cell = (OBJECT_TO_IDX[thing.type], COLOR_TO_IDX[thing.color], state)
        image[agent_x + thing.dx, agent_y - thing.dy] = cell
    if carrying is not None:
        # minigrid encodes the carried object in the agent's own cell.
        image[agent_x, agent_y] = (OBJECT_TO_IDX[carrying[0]], COLOR_TO_IDX[carrying[1]], 0)
    return describe_view(image, language)


@dataclass(frozen=True)
class Probe:
    """A situation as the run's policy reads it."""

    situation: Situation
    prompt: str
    candidates: tuple[str, ...]
    """The run's action words, in order (the rollout's candidates)."""
    right_index: int
    """Index of the right action in `candidates`."""


def _word_of(space: ActionSpace, action: str) -> str | None:
    """The first word of `space` for minigrid action `action`, None when it has none."""
    code = int(Actions[action])
    return next(
        (word for word, a in zip(space.words, space.minigrid_actions, strict=True) if a == code),
        None,
    )


def build_probes(
    env_cfg: EnvConfig, policy_cfg: PolicyConfig, tokenizer: Any = None
) -> list[Probe]:
    """The situations whose right action the run's action space has, as its prompts.

    Raises:
        ValueError: an unknown action space or language, or `chat` without a tokenizer.
    """
    space = get_action_space(env_cfg.action_space)
    probes = []
    for situation in SITUATIONS:
        right = _word_of(space, situation.right_action)
        if right is None:
            continue
        history = PromptHistory(env_cfg.nbr_obs)
        history.add_observation(
            describe_scene(situation.seen, situation.carrying, env_cfg.language)
        )
        prompt = history.prompt(
            translate_mission(situation.mission, env_cfg.language),
            space.words,
            env_cfg.language,
            prompt_format=policy_cfg.prompt_format,
            tokenizer=tokenizer,
        )
        probes.append(Probe(situation, prompt, tuple(space.words), space.words.index(right)))
    return probes


class ActionProbe:
    """Every `every` updates, the policy's action probabilities in the probe situations.

    `after_update` runs the policy on every process (under DeepSpeed ZeRO-3 a forward pass is a
    collective: every process must make it); only the main process (`enabled`) writes probe.csv
    and returns metrics: `probe/right_action_prob`, the mean over situations of the right
    action's probability, and the same per task type (`probe/right_action_prob/goto`...).
    """

    def __init__(
        self,
        run_dir: str | Path,
        every: int,
        env_cfg: EnvConfig,
        policy_cfg: PolicyConfig,
        tokenizer: Any = None,
        enabled: bool = True,
    ) -> None:
        """
        Args:
            run_dir: the run folder; probe.csv is written there.
            every: probe when the update number is a multiple of this (`train.probe_every`).
            env_cfg: the run's action space, language and `nbr_obs`.
            policy_cfg: the prompt format; `kind` must be a text policy (`llm` or `drrn`).
            tokenizer: the model's tokenizer (the `chat` prompt format needs its template).
            enabled: whether this is the main process (the one that writes).

        Raises:
            ValueError: `every` < 1, a policy that does not read text, or no situation left.
        """
        if every < 1:
            raise ValueError(
                f"the probe runs every `every` updates; every must be >= 1, got {every}"
            )
        if policy_cfg.kind == "symbolic":
            raise ValueError(
                "the action-probability probe scores text prompts; policy.kind=symbolic reads "
                "the grid: set train.probe_every=0"
            )
        self.every = every
        self.enabled = enabled
        self.path = Path(run_dir) / PROBE_CSV
        self.probes = build_probes(env_cfg, policy_cfg, tokenizer)
        if not self.probes:
            raise ValueError(f"no probe situation can be answered with {env_cfg.action_space!r}")
        self._first_write = True

    @property
    def metric_names(self) -> list[str]:
        """The keys `after_update` returns when it probes (e.g. to declare log columns)."""
        types = sorted({probe.situation.task_type for probe in self.probes})
        return ["probe/right_action_prob", *(f"probe/right_action_prob/{t}" for t in types)]

    @torch.no_grad()
    def after_update(self, update: int, model: Any) -> dict[str, float]:
        """Probe after update `update` if it is a multiple of `every`; return the metrics (main
        process) or {} (other processes, and updates that are not probed)."""
        if update % self.every:
            return {}
        was_training = model.training
        model.eval()
        try:
            output = model(
                [probe.prompt for probe in self.probes],
                [list(probe.candidates) for probe in self.probes],
            )
        finally:
            model.train(was_training)
        probs = output.dist.probs.float().cpu()  # (probes, actions)
        if not self.enabled:
            return {}
        self._write(update, probs)
        return self._metrics(probs)

    def _metrics(self, probs: torch.Tensor) -> dict[str, float]:
        right = [float(probs[i, p.right_index]) for i, p in enumerate(self.probes)]
        by_type: dict[str, list[float]] = defaultdict(list)
        for probe, p in zip(self.probes, right, strict=True):
            by_type[probe.situation.task_type].append(p)
        metrics = {"probe/right_action_prob": sum(right) / len(right)}
        for task_type, values in sorted(by_type.items()):
            metrics[f"probe/right_action_prob/{task_type}"] = sum(values) / len(values)
        return metrics

    def _write(self, update: int, probs: torch.Tensor) -> None:
        rows = [
            {
                "update": update,
                "probe": probe.situation.id,
                "task_type": probe.situation.task_type,
                "action": action,
                "probability": float(probs[i, j]),
                "is_right": j == probe.right_index,
            }
            for i, probe in enumerate(self.probes)
            for j, action in enumerate(probe.candidates)
        ]
        if self._first_write:
            self._drop_rows_from(update)
            self._first_write = False
        new_file = not self.path.is_file()
        with self.path.open("a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=PROBE_COLUMNS)
            if new_file:
                writer.writeheader()
            writer.writerows(rows)

    def _drop_rows_from(self, update: int) -> None:
        """A resumed run's first probe: rows from this update on were written by the session
        that was interrupted (after the checkpoint it resumes from), and are dropped."""
        if not self.path.is_file():
            return
        with self.path.open(newline="") as file:
            kept = [row for row in csv.DictReader(file) if int(row["update"]) < update]
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with tmp.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=PROBE_COLUMNS)
            writer.writeheader()
            writer.writerows(kept)
        tmp.replace(self.path)


class ProbeHook(TrainerHook):
    """Runs the `ActionProbe` inside a PPO run (`train.probe_every`): once before the first
    update of a fresh run (update 0: the untrained policy), then every `probe_every` updates.

    Every update's row of metrics.csv has the probe's columns (blank between probes: the CSV's
    columns are fixed by its first row)."""

    def __init__(self) -> None:
        self.probe: ActionProbe | None = None

    def start(self, training: Training) -> None:
        cfg, accelerator = training.cfg, training.accelerator
        policy = accelerator.unwrap_model(training.model)
        self.probe = ActionProbe(
            training.run_dir,
            cfg.train.probe_every,
            cfg.env,
            cfg.policy,
            tokenizer=getattr(policy, "tokenizer", None),
            enabled=accelerator.is_main_process,
        )
        if training.state.update == 0:
            self.probe.after_update(0, training.model)

    def after_update(
        self, training: Training, model: torch.nn.Module, metrics: dict[str, float]
    ) -> dict[str, float]:
        found = self.probe.after_update(training.state.update, model)
        return {name: found.get(name, math.nan) for name in self.probe.metric_names}
