"""Linear probes of a language model's hidden states on the bot's states: do the states that the
policy's adapters and heads read hold what the policy needs?

The pipeline of `scripts/probe_features.py`, one function per stage:

1. **States.** BabyAI's bot plays episodes of a level (the demonstrations collector
   `glam.bc.bot.collect_bot_demos`, called by the script: `glam.bc` sits above evaluation, its
   success test plays through it) and `states_from_records` takes its decisions, or an existing
   demonstrations folder is read (`read_states`), or an agent's evaluated episodes are
   replayed from their seeds and actions (`read_played_episodes`: the agent's own states and
   returns, what its critic must predict); either way each decision's prompt (the policy's
   own, `glam.policy.prompts`), the action taken and the episode id are kept. Each
   episode is then replayed from its seed with the recorded actions (`replay_targets`), and at
   each step the mission's TARGET object is located on minigrid's grid (`target_features`): its
   offsets in the agent's egocentric frame and whether the agent sees it. The replay checks that
   it reproduces the recorded prompts.
2. **Features.** The hidden state of each prompt's last token at the chosen layers
   (`last_token_states`): `hidden_states[k]` of transformers' `output_hidden_states`, so `k` is
   the input of layer `k` (0: the embeddings) and `k = num_layers` the last layer's output
   after the final norm, the state the value head reads. One batched, left-padded forward per
   batch, without gradients.
3. **Probes.** A multinomial logistic regression (`fit_linear_probe`: standardised features, L2
   penalty, L-BFGS to convergence) predicts the bot's action and the target's direction, trained
   on some episodes and scored on others (`split_episodes`: whole episodes are held out, never a
   step of an episode seen in training). The L2 strength is picked on a validation split of the
   training episodes (`choose_l2`). Beside each layer: the majority class of the training split,
   and the same regression on the hand-made target features alone (`probe_task`).
4. **Value.** A ridge regression (`fit_ridge`, `probe_value`) predicts the discounted return the
   bot's episode got from each state (`replay_returns`, `GAMMA` = PPO's 0.99): what a critic of
   the bot's policy must say, scored by R^2 on the held-out episodes (and PPO's explained
   variance, which does not count a bias), beside the training mean (R^2 at most 0) and the
   mean return of each hand-made key (`table_value`). It says whether the features a value
   head reads hold the value. `fit_value_head` then trains PPO's own value head
   (`glam.policy.heads.ValueHead`) on the same states by Adam, at a given learning rate and
   number of steps: whether the head PPO trains finds, in PPO's steps, what the ridge finds.

The direction classes (`DIRECTIONS`) are what one observation can tell: the 7x7 view covers the
agent's row and the six rows ahead, so a visible target is never behind; an unseen one is
`not visible` (with one observation in the prompt, where it is cannot be read from the text).
The hand-made features are the grid's truth, for a visible target or not.

    config = DemosConfig(level="BabyAI-GoToRedBall-v0", episodes=100, action_space="nav",
                         nbr_obs=1)
    records, _ = collect_bot_demos(config)
    states = states_from_records(records, config.level, config.action_space)
    features = last_token_states(model, tokenizer, states.prompts, [26, 30])
    report = probe_states(states, features, held_out=0.25, seed=0)
"""

from __future__ import annotations

import difflib
import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase

import babyai_text
from babyai_text.env import known_level_ids
from glam.demos import DemoRecord, ReplayedStep, demo_metadata, load_demos, replay_demonstrations
from glam.envs import record_episode
from glam.policy.heads import ValueHead
from glam.scoring import appends_eos, model_kind, unwrap_model

__all__ = [
    "DIRECTIONS",
    "GAMMA",
    "L2_GRID",
    "TARGET_FEATURES",
    "LinearProbe",
    "ProbeInputError",
    "ProbeStates",
    "RidgeProbe",
    "TargetFeatures",
    "check_layers",
    "check_level",
    "choose_l2",
    "explained_variance",
    "feature_statistics",
    "fit_linear_probe",
    "fit_ridge",
    "last_token_states",
    "majority_accuracy",
    "table_accuracy",
    "num_layers",
    "probe_states",
    "probe_task",
    "probe_value",
    "r_squared",
    "replay_returns",
    "table_value",
    "read_states",
    "replay_targets",
    "split_episodes",
    "states_from_records",
    "target_features",
]

DIRECTIONS: tuple[str, ...] = ("forward", "left", "right", "not visible")
"""Where the target is, as one observation shows it: straight ahead (same column), left or right
of the agent's column, or not in view (out of the 7x7 view or hidden behind a wall)."""
TARGET_FEATURES: tuple[str, ...] = ("right", "forward", "visible")
"""The hand-made features of a state, in `TargetFeatures.vector` order."""
GAMMA = 0.99
"""The discount of the returns the value probe predicts: PPO's `ppo.gamma` default."""
L2_GRID: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
"""L2 strengths tried on the validation episodes (the penalty is `l2 * ||W||^2` beside the mean
cross-entropy, on standardised features)."""


class ProbeInputError(ValueError):
    """An input the probe cannot use: a level, a layer, a dataset, a run. The message says why."""


# --------------------------------------------------------------------------------------------
# States: the bot's decisions, and where the target is at each
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetFeatures:
    """Where the mission's target object is, seen from the agent."""

    right: int
    """Steps to the right of the agent's column (negative: to the left)."""
    forward: int
    """Steps ahead of the agent's row (negative: behind)."""
    visible: bool
    """In the agent's 7x7 view and not hidden behind a wall or closed door: in the prompt."""
    matches: int = 1
    """Objects that fit the mission's description (the nearest is the target)."""

    @property
    def direction(self) -> str:
        """The coarse class of `DIRECTIONS`."""
        if not self.visible:
            return "not visible"
        if self.right == 0:
            return "forward"
        return "left" if self.right < 0 else "right"

    @property
    def vector(self) -> list[float]:
        """The hand-made features, in `TARGET_FEATURES` order."""
        return [float(self.right), float(self.forward), float(self.visible)]


def target_features(env: Any) -> TargetFeatures:
    """The target of `env`'s mission (a minigrid BabyAI env or a wrapper of one) right now.

    The target is the object the instruction describes (`instrs.desc` of a go-to, pick-up or
    open instruction); among several that fit, the nearest to the agent (Manhattan distance).

    Raises:
        ProbeInputError: the mission does not name one object (put next to, sequences), or no
            object on the grid fits it.
    """
    base = env.unwrapped
    instruction = getattr(base, "instrs", None)
    desc = getattr(instruction, "desc", None)
    if desc is None or not hasattr(desc, "obj_set"):
        kind = type(instruction).__name__ if instruction is not None else "no instruction"
        raise ProbeInputError(
            f"the mission {getattr(base, 'mission', '?')!r} ({kind}) does not name one target "
            "object: the target features need a go to, pick up or open mission"
        )
    positions = [
        np.asarray(obj.cur_pos)
        for obj in desc.obj_set
        if obj.cur_pos is not None and min(obj.cur_pos) >= 0  # carried objects sit at (-1, -1)
    ]
    if not positions:
        raise ProbeInputError(f"no object on the grid fits the mission {base.mission!r}")
    agent = np.asarray(base.agent_pos)
    target = min(positions, key=lambda pos: int(np.abs(pos - agent).sum()))
    offset = target - agent
    right = int(offset @ np.asarray(base.right_vec))
    forward = int(offset @ np.asarray(base.dir_vec))
    return TargetFeatures(
        right=right, forward=forward, visible=_sees(base, target), matches=len(positions)
    )


def _sees(base: Any, position: np.ndarray) -> bool:
    """Whether the cell at `position` is drawn in the agent's view (the mask the describer uses)."""
    coordinates = base.relative_coords(int(position[0]), int(position[1]))
    if coordinates is None:
        return False
    _, visible = base.gen_obs_grid()
    return bool(visible[coordinates[0], coordinates[1]])


@dataclass
class ProbeStates:
    """The decisions probed: one entry per state, in episode and step order."""

    prompts: list[str]
    actions: list[str]
    """The bot's action word at each state."""
    episodes: list[int]
    targets: list[TargetFeatures]
    level: str
    action_words: list[str]
    """The action space's words, in its order (the action classes)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """How the states were made (collection settings, or the dataset's folder and metadata)."""
    returns: list[float] = field(default_factory=list)
    """The discounted return the episode got from each state on (`replay_returns`), what a
    critic of the policy that played it predicts; empty where not computed."""
    steps: list[int] = field(default_factory=list)
    """Each state's step in its episode (0 first): what a prompt of one observation does not
    show; empty where not known."""

    def __len__(self) -> int:
        return len(self.prompts)

    def labels(self) -> dict[str, tuple[list[str], list[int]]]:
        """Each probed task's class names and the class index of every state."""
        directions = [target.direction for target in self.targets]
        return {
            "action": (
                list(self.action_words),
                [self.action_words.index(a) for a in self.actions],
            ),
            "direction": (list(DIRECTIONS), [DIRECTIONS.index(d) for d in directions]),
        }

    def hand_made(self) -> Tensor:
        """`(states, len(TARGET_FEATURES))` the hand-made target features."""
        return torch.tensor([target.vector for target in self.targets], dtype=torch.float64)


def check_level(level: str, action_space: str = "default", language: str | None = None) -> str:
    """`level`, when the probe can use it: a registered BabyAI level whose mission names one
    target object (checked on its first episode's reset).

    Raises:
        ProbeInputError: an unknown id (with the nearest known ones), or a mission without one
            target.
    """
    known = known_level_ids()
    if level not in known:
        close = difflib.get_close_matches(level, known, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else "see babyai_text.LEVELS"
        raise ProbeInputError(f"unknown BabyAI level {level!r} ({hint})")
    env = _make_env(level, action_space, language)
    env.reset(seed=0)
    target_features(env)
    return level


def _replay(
    records: Sequence[DemoRecord], level: str, action_space: str, language: str | None
) -> Iterator[ReplayedStep]:
    """`records`' episodes replayed (`glam.demos.replay_demonstrations`)."""
    rows = [asdict(record) for record in records]
    return replay_demonstrations(rows, level, action_space, language, error=ProbeInputError)


def _make_env(level: str, action_space: str, language: str | None) -> babyai_text.TextEnv:
    try:
        return babyai_text.make(level, action_space=action_space, language=language)
    except ValueError as error:
        raise ProbeInputError(str(error)) from None


def states_from_records(
    records: Sequence[DemoRecord],
    level: str,
    action_space: str,
    language: str | None = None,
    settings: Mapping[str, Any] | None = None,
    gamma: float = GAMMA,
) -> ProbeStates:
    """The states of the bot's decisions `records` (`glam.bc.bot.collect_bot_demos`), with
    their targets and their discounted returns (`gamma`) found by replaying each episode
    (`replay_targets`, `replay_returns`).

    Raises:
        ProbeInputError: no records, or episodes the replay does not reproduce.
    """
    if not records:
        raise ProbeInputError(f"no decisions to probe on {level} (did the bot solve none?)")
    env = _make_env(level, action_space, language)
    return ProbeStates(
        prompts=[record.prompt for record in records],
        actions=[record.action for record in records],
        episodes=[record.episode for record in records],
        targets=replay_targets(records, level, action_space, language),
        level=level,
        action_words=list(env.action_words),
        settings=dict(settings or {}),
        returns=replay_returns(records, level, action_space, language, gamma),
        steps=[record.step for record in records],
    )


def read_states(path: str | Path, gamma: float = GAMMA) -> ProbeStates:
    """The states of a demonstrations folder (`scripts/collect_bot_demos.py`), with their
    targets found by replaying each episode from its seed.

    Raises:
        glam.demos.DemoDatasetError: not a demonstrations folder.
        ProbeInputError: rows of several levels or action spaces, or episodes the replay does
            not reproduce.
    """
    dataset = load_demos(path, required=("prompt", "action", "action_index", "episode", "seed"))
    metadata = demo_metadata(dataset)
    rows = [dict(row) for row in dataset]
    levels = {row["level"] for row in rows}
    spaces = {row["action_space"] for row in rows}
    if len(levels) != 1 or len(spaces) != 1:
        raise ProbeInputError(
            f"{path} mixes levels {sorted(levels)} or action spaces {sorted(spaces)}: probe one "
            "level and action space at a time"
        )
    level, space, language = levels.pop(), spaces.pop(), metadata.get("language")
    check_level(level, space, language)
    records = [DemoRecord(**row) for row in rows]
    return states_from_records(
        records, level, space, language, settings={"source": str(path), **metadata}, gamma=gamma
    )


def read_played_episodes(
    path: str | Path,
    level: str,
    *,
    action_space: str,
    nbr_obs: int,
    prompt_format: str = "glam",
    language: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    suite: str = "no_change",
    gamma: float = GAMMA,
) -> ProbeStates:
    """The states an agent visited in an evaluation's episodes (`episodes.jsonl` of
    `scripts/post_training_tests.py`, the rows of `suite`): each episode replayed from its seed
    with its recorded actions, each decision with the prompt the policy read there, the agent's
    action in place of the bot's, and the discounted return (`gamma`) the agent got from it:
    what the agent's own critic must predict.

    Raises:
        ProbeInputError: no rows of `suite`, rows without seed or actions, or a replay that
            does not end as the row says (another level, action space or env version).
    """
    path = Path(path)
    if not path.is_file():
        raise ProbeInputError(f"{path}: no such file (an evaluation's episodes.jsonl)")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("suite", suite) == suite]
    if not rows:
        raise ProbeInputError(f"{path} has no episode of suite {suite!r}")
    env = _make_env(level, action_space, language)
    records: list[DemoRecord] = []
    for episode, row in enumerate(rows):
        if "seed" not in row or "actions" not in row:
            raise ProbeInputError(f"{path}, row {episode + 1}: no 'seed' or 'actions'")
        words = str(row["actions"]).split()
        if not all(word.isdigit() for word in words):
            raise ProbeInputError(
                f"{path}, episode seed {row['seed']}: an invalid action ('-') among its actions; "
                "only episodes of valid actions replay"
            )
        actions = [int(word) for word in words]
        played, success = record_episode(
            env,
            lambda step, actions=actions: actions[step] if step < len(actions) else None,
            level=level,
            seed=int(row["seed"]),
            episode=episode,
            nbr_obs=nbr_obs,
            prompt_format=prompt_format,
            tokenizer=tokenizer,
            source="agent",
        )
        if len(played) != len(actions) or success != bool(row.get("success", success)):
            raise ProbeInputError(
                f"{path}, episode seed {row['seed']}: replaying its {len(actions)} actions on "
                f"{level} ({action_space}) ended after {len(played)} steps, success {success}, "
                f"where the evaluation recorded success {row.get('success')}: was it another "
                "level, action space or version of the env?"
            )
        records.extend(played)
    return states_from_records(
        records,
        level,
        action_space,
        language,
        settings={"source": str(path), "suite": suite, "episodes_of": "agent"},
        gamma=gamma,
    )


def replay_targets(
    records: Sequence[DemoRecord], level: str, action_space: str, language: str | None = None
) -> list[TargetFeatures]:
    """The target at each record's state, found by replaying its episode: reset with the
    episode's seed, then the recorded actions in step order. Records keep their order.

    Raises:
        ProbeInputError: an episode whose steps are not 0, 1, 2..., or whose replay does not
            show what its prompts show (another mission, or an observation missing from the
            prompt: the env or its version differs from the one that recorded it).
    """
    targets: list[TargetFeatures | None] = [None] * len(records)
    for step in _replay(records, level, action_space, language):
        targets[step.index] = target_features(step.env)
    return targets  # type: ignore[return-value]  # every index was filled above


def replay_returns(
    records: Sequence[DemoRecord],
    level: str,
    action_space: str,
    language: str | None = None,
    gamma: float = GAMMA,
) -> list[float]:
    """The discounted return from each record's state, `sum_k gamma**k * r_(t+k)` over the
    rest of its episode (the env's own rewards, found by replaying the episode from its seed
    with the recorded actions, the last one included). Records keep their order; their steps
    are checked by `replay_targets`.

    Raises:
        ProbeInputError: `gamma` outside [0, 1].
    """
    if not 0.0 <= gamma <= 1.0:
        raise ProbeInputError(f"gamma must be in [0, 1], got {gamma}")
    returns = [0.0] * len(records)
    future, episode = 0.0, None
    # Listed first: each step's reward (`after`) is filled as the replay goes on.
    for step in reversed(list(_replay(records, level, action_space, language))):
        if records[step.index].episode != episode:  # the last step of the episode before
            future, episode = 0.0, records[step.index].episode
        future = step.after[1] + gamma * future  # type: ignore[index]  # filled by now
        returns[step.index] = future
    return returns


# --------------------------------------------------------------------------------------------
# Features: the last prompt token's hidden states
# --------------------------------------------------------------------------------------------


def num_layers(model: nn.Module) -> int:
    """The number of transformer layers of a causal language model (or a peft wrapper of one).

    Raises:
        ProbeInputError: an encoder-decoder model (its prompt state is the decoder's first
            position, not a last prompt token).
    """
    try:
        kind = model_kind(model)
    except ValueError as error:
        raise ProbeInputError(str(error)) from None
    if kind != "causal":
        raise ProbeInputError(
            "the probe reads the last prompt token of a causal language model; this is an "
            "encoder-decoder model"
        )
    return int(unwrap_model(model).config.get_text_config().num_hidden_layers)


def check_layers(layers: Iterable[int], count: int) -> list[int]:
    """`layers`, sorted and unique, when each indexes `hidden_states` of a `count`-layer model.

    Raises:
        ProbeInputError: an index below 0 or above `count`.
    """
    layers = sorted(set(layers))
    bad = [layer for layer in layers if not 0 <= layer <= count]
    if bad or not layers:
        raise ProbeInputError(
            f"--layers {' '.join(map(str, bad or layers))}: the model has {count} layers, its "
            f"hidden states are numbered 0 (the embeddings) to {count} (the last layer's output)"
        )
    return layers


@torch.no_grad()
def last_token_states(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    layers: Sequence[int],
    *,
    batch_size: int = 16,
    progress: bool = False,
) -> dict[int, Tensor]:
    """`{layer: (len(prompts), hidden) float32 CPU tensor}`: each prompt's last token's state
    at `hidden_states[layer]`.

    Prompts are tokenised as the scorer tokenises them (special tokens on, a trailing EOS
    dropped), sorted by length so that a batch pads little, left-padded with position ids that
    count real tokens only, so every row's last column is its last token.
    """
    count = num_layers(model)
    layers = check_layers(layers, count)
    model = unwrap_model(model)
    device = next(model.parameters()).device
    encoded = tokenizer(list(prompts), add_special_tokens=True)["input_ids"]
    if appends_eos(tokenizer):
        encoded = [ids[:-1] for ids in encoded]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    hidden_size = model.config.get_text_config().hidden_size
    states = {layer: torch.empty(len(encoded), hidden_size) for layer in layers}
    with Progress(
        TextColumn("[bold]hidden states[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not progress,
    ) as bar:
        task = bar.add_task("prompts", total=len(encoded))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = max(len(encoded[i]) for i in rows)
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
            attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
            for row, i in enumerate(rows):  # building the batch, not the model path
                input_ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                attention_mask[row, width - len(encoded[i]) :] = 1
            position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
            outputs = model(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                position_ids=position_ids.to(device),
                output_hidden_states=True,
                use_cache=False,
            )
            index = torch.tensor(rows)
            for layer in layers:
                states[layer][index] = outputs.hidden_states[layer][:, -1].float().cpu()
            bar.update(task, advance=len(rows))
    return states


# --------------------------------------------------------------------------------------------
# Probes: split by episode, logistic regression, majority
# --------------------------------------------------------------------------------------------


def split_episodes(
    episodes: Iterable[int], held_out: float, seed: int
) -> tuple[list[int], list[int]]:
    """Split the distinct episode ids into (kept, held out), `held_out` of them held out (at
    least one each side), drawn with `seed`. Both lists are sorted.

    Raises:
        ProbeInputError: fewer than two episodes, or `held_out` outside (0, 1).
    """
    ids = sorted(set(episodes))
    if not 0 < held_out < 1:
        raise ProbeInputError(f"the held-out fraction must be in (0, 1), got {held_out}")
    if len(ids) < 2:
        raise ProbeInputError(f"{len(ids)} episode(s): a split by episode needs at least two")
    count = min(max(1, round(held_out * len(ids))), len(ids) - 1)
    shuffled = ids.copy()
    random.Random(seed).shuffle(shuffled)
    return sorted(shuffled[count:]), sorted(shuffled[:count])


@dataclass
class LinearProbe:
    """A multinomial logistic regression on standardised features."""

    mean: Tensor
    """`(features,)` training mean."""
    scale: Tensor
    """`(features,)` training standard deviation (1 where a feature is constant)."""
    weight: Tensor
    """`(features, classes)`."""
    bias: Tensor
    """`(classes,)`."""
    iterations: int = 0
    """L-BFGS iterations the fit took."""

    def logits(self, features: Tensor) -> Tensor:
        """`(states, classes)` logits of `(states, features)` features."""
        return ((features.double() - self.mean) / self.scale) @ self.weight + self.bias

    def predict(self, features: Tensor) -> Tensor:
        """`(states,)` the most likely class of each state."""
        return self.logits(features).argmax(1)

    def accuracy(self, features: Tensor, labels: Tensor) -> float:
        """Share of states whose predicted class is `labels`'."""
        return float((self.predict(features) == labels).double().mean())


def fit_linear_probe(
    features: Tensor, labels: Tensor, num_classes: int, l2: float, *, max_iter: int = 2000
) -> LinearProbe:
    """Fit `softmax(standardise(features) @ W + b)` to `labels` by minimising the mean
    cross-entropy plus `l2 * ||W||^2` (the bias is not penalised) with L-BFGS, in float64.

    The objective is strictly convex for `l2 > 0`, so L-BFGS with a strong-Wolfe line search
    reaches its minimum; `max_iter` only bounds a pathological case.
    """
    if l2 <= 0:
        raise ValueError(f"l2 must be > 0 (separable data has no minimum without it), got {l2}")
    x = features.double()
    mean = x.mean(0)
    scale = x.std(0, unbiased=False)
    scale = torch.where(scale > 1e-8, scale, torch.ones_like(scale))
    x = (x - mean) / scale
    y = labels.long()
    weight = torch.zeros(x.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(x @ weight + bias, y) + l2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    iterations = optimizer.state[weight].get("n_iter", 0)
    return LinearProbe(mean, scale, weight.detach(), bias.detach(), iterations=int(iterations))


def majority_accuracy(train_labels: Tensor, test_labels: Tensor) -> float:
    """Accuracy on `test_labels` of always answering the commonest class of `train_labels`
    (the lowest index among ties)."""
    counts = torch.bincount(train_labels.long())
    return float((test_labels == counts.argmax()).double().mean())


def table_accuracy(
    keys: Tensor, train_labels: Tensor, test_keys: Tensor, test_labels: Tensor
) -> float:
    """Accuracy on the test states of the best rule that reads only `keys` (the hand-made
    features, `(states, k)`): each distinct key's commonest training label (the lowest index
    among ties), the commonest label overall for a key no training state had. No linear limit:
    the most any function of those features gets, up to what the training states saw."""
    overall = int(torch.bincount(train_labels.long()).argmax())
    counts: dict[tuple[float, ...], Counter[int]] = {}
    for key, label in zip(keys.tolist(), train_labels.tolist(), strict=True):
        counts.setdefault(tuple(key), Counter())[int(label)] += 1
    predicted = [
        min(c, key=lambda label: (-c[label], label)) if (c := counts.get(tuple(key))) else overall
        for key in test_keys.tolist()
    ]
    return float((torch.tensor(predicted) == test_labels.long()).double().mean())


def _state_mask(episodes: Tensor, chosen: Sequence[int]) -> Tensor:
    return torch.isin(episodes, torch.tensor(list(chosen), dtype=episodes.dtype))


def choose_l2(
    features: Tensor,
    labels: Tensor,
    episodes: Tensor,
    train_episodes: Sequence[int],
    num_classes: int,
    *,
    grid: Sequence[float] = L2_GRID,
    validation: float = 0.2,
    seed: int = 0,
) -> tuple[float, dict[str, float]]:
    """The L2 strength of `grid` with the best accuracy on validation episodes drawn from
    `train_episodes` (the largest among ties: the simplest model), and each one's accuracy."""
    fit_ids, val_ids = split_episodes(train_episodes, validation, seed)
    fit, val = _state_mask(episodes, fit_ids), _state_mask(episodes, val_ids)
    scores = {}
    for l2 in grid:
        probe = fit_linear_probe(features[fit], labels[fit], num_classes, l2)
        scores[l2] = probe.accuracy(features[val], labels[val])
    best = max(scores.values())
    chosen = max(l2 for l2, score in scores.items() if score == best)
    return chosen, {f"{l2:g}": score for l2, score in scores.items()}


def probe_task(
    features: Tensor,
    labels: Tensor,
    episodes: Tensor,
    train_episodes: Sequence[int],
    test_episodes: Sequence[int],
    num_classes: int,
    *,
    l2: float | None = None,
    grid: Sequence[float] = L2_GRID,
    seed: int = 0,
) -> dict[str, Any]:
    """Train a probe on the `train_episodes`' states (with `l2`, or the one `choose_l2` picks)
    and score it on the `test_episodes`' states."""
    train = _state_mask(episodes, train_episodes)
    test = _state_mask(episodes, test_episodes)
    validation = None
    if l2 is None:
        l2, validation = choose_l2(
            features, labels, episodes, train_episodes, num_classes, grid=grid, seed=seed
        )
    probe = fit_linear_probe(features[train], labels[train], num_classes, l2)
    result = {
        "accuracy": probe.accuracy(features[test], labels[test]),
        "train_accuracy": probe.accuracy(features[train], labels[train]),
        "l2": l2,
        "iterations": probe.iterations,
    }
    if validation is not None:
        result["validation_accuracy"] = validation
    return result


def probe_states(
    states: ProbeStates,
    features: Mapping[int, Tensor],
    *,
    held_out: float = 0.25,
    seed: int = 0,
    l2: float | None = None,
    grid: Sequence[float] = L2_GRID,
    value_heads: Sequence[HeadFit] = (),
) -> dict[str, Any]:
    """Every task's held-out accuracies: the majority class, the hand-made features and each
    layer's states, with the split's and the classes' counts; with returns, the value's held-out
    R^2 by ridge regression and by each of `value_heads` trained on each layer's states."""
    episodes = torch.tensor(states.episodes)
    train_ids, test_ids = split_episodes(states.episodes, held_out, seed)
    train, test = _state_mask(episodes, train_ids), _state_mask(episodes, test_ids)
    # where the target is: its offsets when visible, one key for "not in view"
    table_keys = states.hand_made() * states.hand_made()[:, 2:3]
    feature_sets = {"hand_made": states.hand_made()} | {
        f"layer_{layer}": tensor for layer, tensor in features.items()
    }
    tasks = {}
    for task, (classes, indices) in states.labels().items():
        labels = torch.tensor(indices)
        tasks[task] = {
            "classes": classes,
            "train_counts": _counts(classes, labels[train]),
            "test_counts": _counts(classes, labels[test]),
            "majority": majority_accuracy(labels[train], labels[test]),
            "hand_made_table": table_accuracy(
                table_keys[train], labels[train], table_keys[test], labels[test]
            ),
            "probes": {
                name: probe_task(
                    tensor,
                    labels,
                    episodes,
                    train_ids,
                    test_ids,
                    len(classes),
                    l2=l2,
                    grid=grid,
                    seed=seed + 1,
                )
                for name, tensor in feature_sets.items()
            },
        }
    value = None
    if states.returns:
        returns = torch.tensor(states.returns, dtype=torch.float64)
        whose = "the agent's" if states.settings.get("episodes_of") == "agent" else "the bot's"
        value = {
            "target": f"{whose} discounted return from the state (ProbeStates.returns)",
            "train_mean": float(returns[train].mean()),
            "train_std": float(returns[train].std(unbiased=False)),
            "mean": r_squared(
                torch.full_like(returns[test], float(returns[train].mean())), returns[test]
            ),
            "hand_made_table": table_value(
                table_keys[train], returns[train], table_keys[test], returns[test]
            ),
            **_time_controls(states, returns, train, test),
            "probes": {
                name: probe_value(
                    tensor, returns, episodes, train_ids, test_ids, l2=l2, grid=grid, seed=seed + 1
                )
                for name, tensor in feature_sets.items()
            },
            "heads": {
                f"layer_{layer}": [
                    fit_value_head(tensor, returns, episodes, train_ids, test_ids, fit, seed=seed)
                    for fit in value_heads
                ]
                for layer, tensor in features.items()
            },
        }
    return {
        "states": len(states),
        "episodes": len(set(states.episodes)),
        "train": {"states": int(train.sum()), "episodes": len(train_ids)},
        "test": {"states": int(test.sum()), "episodes": len(test_ids)},
        "held_out": held_out,
        "seed": seed,
        "hand_made_features": list(TARGET_FEATURES),
        "tasks": tasks,
        "value": value,
        "feature_statistics": {
            f"layer_{layer}": feature_statistics(tensor) for layer, tensor in features.items()
        },
    }


def _time_controls(
    states: ProbeStates, returns: Tensor, train: Tensor, test: Tensor
) -> dict[str, float]:
    """Held-out R^2 of what the prompt does not show: a ridge regression (next to no penalty)
    on the state's step (`t`, `t^2`), alone and beside the hand-made features. Where the step
    explains the return and the prompt's features do not, a critic that reads the prompt cannot
    explain it either (the return depends on the time left, as in Pardo et al. 2018)."""
    if len(states.steps) != len(states):
        return {}
    t = torch.tensor(states.steps, dtype=torch.float64)
    time = torch.stack([t, t * t], 1)
    both = torch.cat([states.hand_made(), time], 1)
    return {
        f"{name}_r2": r_squared(
            fit_ridge(x[train], returns[train], 1e-3).predict(x[test]), returns[test]
        )
        for name, x in (("step", time), ("hand_made_and_step", both))
    }


def explained_variance(predicted: Tensor, targets: Tensor) -> float:
    """`1 - Var(targets - predicted) / Var(targets)`, PPO's `losses/explained_variance`: 1 for
    a perfect guess, 0 for any constant one (a bias is not counted; NaN if the targets do not
    vary)."""
    variance = targets.double().var(unbiased=False)
    if variance <= 0:
        return float("nan")
    return float(1 - (targets.double() - predicted.double()).var(unbiased=False) / variance)


def r_squared(predicted: Tensor, targets: Tensor) -> float:
    """`1 - sum((targets - predicted)**2) / sum((targets - mean(targets))**2)`: like
    `explained_variance`, but a bias counts, so a constant guess other than the targets' own
    mean scores below 0 (NaN if the targets do not vary)."""
    y = targets.double()
    total = (y - y.mean()).square().sum()
    if total <= 0:
        return float("nan")
    return float(1 - (y - predicted.double()).square().sum() / total)


@dataclass
class RidgeProbe:
    """A linear regression on standardised features, with an L2 penalty."""

    mean: Tensor
    scale: Tensor
    weight: Tensor
    """`(features,)`."""
    bias: float

    def predict(self, features: Tensor) -> Tensor:
        return ((features.double() - self.mean) / self.scale) @ self.weight + self.bias


def fit_ridge(features: Tensor, targets: Tensor, l2: float) -> RidgeProbe:
    """Minimise `mean((standardise(x) @ w + b - y)**2) + l2 * ||w||**2` in closed form, in
    float64 (`b` is the targets' mean and is not penalised)."""
    if l2 <= 0:
        raise ValueError(f"l2 must be > 0, got {l2}")
    x = features.double()
    mean = x.mean(0)
    scale = x.std(0, unbiased=False)
    scale = torch.where(scale > 1e-8, scale, torch.ones_like(scale))
    x = (x - mean) / scale
    y = targets.double()
    bias = float(y.mean())
    n = x.shape[0]
    gram = x.T @ x / n + l2 * torch.eye(x.shape[1], dtype=torch.float64)
    weight = torch.linalg.solve(gram, x.T @ (y - bias) / n)
    return RidgeProbe(mean, scale, weight, bias)


def probe_value(
    features: Tensor,
    returns: Tensor,
    episodes: Tensor,
    train_episodes: Sequence[int],
    test_episodes: Sequence[int],
    *,
    l2: float | None = None,
    grid: Sequence[float] = L2_GRID,
    seed: int = 0,
) -> dict[str, Any]:
    """A ridge regression of the returns on the training episodes' states (with `l2`, or the
    one of `grid` with the best R^2 on validation episodes drawn from them, the largest among
    ties): its R^2 (`r_squared`) and explained variance on the test episodes' states."""
    train = _state_mask(episodes, train_episodes)
    test = _state_mask(episodes, test_episodes)
    result: dict[str, Any] = {}
    if l2 is None:
        fit_ids, val_ids = split_episodes(train_episodes, 0.2, seed)
        fit, val = _state_mask(episodes, fit_ids), _state_mask(episodes, val_ids)
        scores = {
            value: r_squared(
                fit_ridge(features[fit], returns[fit], value).predict(features[val]),
                returns[val],
            )
            for value in grid
        }
        best = max(scores.values())
        l2 = max(value for value, score in scores.items() if score == best)
        result["validation_r2"] = {f"{k:g}": v for k, v in scores.items()}
    probe = fit_ridge(features[train], returns[train], l2)
    predicted = probe.predict(features[test])
    return {
        "r2": r_squared(predicted, returns[test]),
        "explained_variance": explained_variance(predicted, returns[test]),
        "train_r2": r_squared(probe.predict(features[train]), returns[train]),
        "l2": l2,
        **result,
    }


@dataclass(frozen=True)
class HeadFit:
    """How `fit_value_head` trains a value head: PPO's own head and optimiser, without the rest
    of PPO (no policy moving the states, no shared gradient clip)."""

    lr: float
    steps: Sequence[int] = (200, 2000)
    """Adam steps after which the held-out fit is read (the largest is the training's length).
    200: the steps of 25 PPO updates of the default preset (2 epochs x 4 minibatches each)."""
    hidden_sizes: Sequence[int] = (1024, 1024)
    activation: str = "sigmoid"
    normalize: bool = False
    """Standardise the input first (`policy.value_norm`), with the training states' statistics."""
    minibatch: int = 64
    adam_eps: float = 1e-5

    @property
    def name(self) -> str:
        widths = "x".join(map(str, self.hidden_sizes))
        shape = f"{widths} {self.activation}" if widths else "linear"  # no activation to name
        norm = ", normalised" if self.normalize else ""
        return f"{shape}{norm}, lr {self.lr:g}"


def fit_value_head(
    features: Tensor,
    returns: Tensor,
    episodes: Tensor,
    train_episodes: Sequence[int],
    test_episodes: Sequence[int],
    fit: HeadFit,
    *,
    seed: int = 0,
) -> dict[str, Any]:
    """Train a value head (`glam.policy.heads.ValueHead`, PPO's critic) on the training
    episodes' states by Adam on the squared error, in minibatches drawn without replacement
    (epoch after epoch), and read its held-out R^2 and explained variance after each of
    `fit.steps`: whether the head PPO trains can learn, in PPO's number of steps, what a
    ridge regression finds in the same features."""
    train = _state_mask(episodes, train_episodes)
    test = _state_mask(episodes, test_episodes)
    x_train, y_train = features[train].float(), returns[train].float()
    x_test, y_test = features[test].float(), returns[test].double()
    torch.manual_seed(seed)
    head = ValueHead(x_train.shape[1], fit.hidden_sizes, fit.activation, fit.normalize)
    if head.norm is not None:
        head.norm.update(x_train)
    optimizer = torch.optim.Adam(head.parameters(), lr=fit.lr, eps=fit.adam_eps)
    generator = torch.Generator().manual_seed(seed)
    order, position = torch.randperm(len(x_train), generator=generator), 0
    readings: dict[str, dict[str, float]] = {}
    for step in range(1, max(fit.steps) + 1):
        if position + fit.minibatch > len(order):
            order, position = torch.randperm(len(x_train), generator=generator), 0
        batch = order[position : position + fit.minibatch]
        position += fit.minibatch
        loss = (head(x_train[batch]) - y_train[batch]).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in fit.steps:
            with torch.no_grad():
                head.train()  # the norm's statistics stay the training states'
                predicted = head(x_test).double()
            readings[str(step)] = {
                "r2": r_squared(predicted, y_test),
                "explained_variance": explained_variance(predicted, y_test),
            }
    return {"head": fit.name, "fit": asdict(fit) | {"steps": list(fit.steps)}, **readings}


def table_value(
    keys: Tensor, train_returns: Tensor, test_keys: Tensor, test_returns: Tensor
) -> float:
    """R^2 (`r_squared`) on the test states of the best guess that reads only `keys` (the
    hand-made features): each distinct key's mean training return, the overall mean for a key
    no training state had."""
    overall = float(train_returns.double().mean())
    sums: dict[tuple[float, ...], list[float]] = defaultdict(list)
    for key, value in zip(keys.tolist(), train_returns.tolist(), strict=True):
        sums[tuple(key)].append(value)
    predicted = [
        sum(found) / len(found) if (found := sums.get(tuple(key))) else overall
        for key in test_keys.tolist()
    ]
    return r_squared(torch.tensor(predicted, dtype=torch.float64), test_returns)


def feature_statistics(features: Tensor, top: int = 5) -> dict[str, float]:
    """How much of the states `(N, D)` differs between states: their mean norm, the share of
    their squared norm in the `top` dimensions of largest mean magnitude, and the share of
    their second moment that varies between states (`sum var / sum E[x^2]`). A head reading
    the raw states sees what differs at about the square root of that share of their scale."""
    x = features.double()
    second_moment = x.square().mean(0)
    largest = x.mean(0).abs().topk(min(top, x.shape[1])).indices
    return {
        "mean_norm": float(x.norm(dim=1).mean()),
        f"top{top}_share": float(second_moment[largest].sum() / second_moment.sum()),
        "varying_share": float(x.var(0, unbiased=False).sum() / second_moment.sum()),
    }


def _counts(classes: Sequence[str], labels: Tensor) -> dict[str, int]:
    counted = Counter(labels.tolist())
    return {name: counted.get(i, 0) for i, name in enumerate(classes)}
