"""BabyAI's actor-critic on minigrid's symbolic observation: the paper's "symbolic PPO" baseline.

The model of Chevalier-Boisvert et al. (2019), as BabyAI 1.1 ships it (`babyai/model.py`,
architecture `bow_endpool_res` with a GRU over the mission, and its optional LSTM memory):

    image (B, 7, 7, 3) -> bag of words: one embedding per (channel, value), summed over the
                          three channels of a cell -> (B, D, 7, 7)
                       -> 2 x [conv 3x3, norm, ReLU]
    mission words      -> hashed ids -> embedding -> GRU -> its output after the last word (B, I)
    `film_layers` x    x = x + FiLMBlock(x, mission)      (residual; FiLM: gamma(m) * x + beta(m))
                       -> max-pool over the 7 x 7 cells, ReLU -> (B, D)
    with `memory`:     -> LSTM cell (D -> D) from the memory (h, c): embedding h (B, D), and the
                          new memory cat(h, c) (B, 2D), passed to the env's next step
                       -> actor MLP (D -> hidden -> A, tanh): one logit per action word
                       -> critic MLP (D -> hidden -> 1, tanh): the state value

With `symbolic.memory` the policy is recurrent: `forward` takes each env's memory (zero at the
start of an episode; None: all zero) and returns the next in `PolicyOutput.memory`, and
`memory_size` says how many numbers it holds (0 without memory, as before: the memoryless network,
its outputs and its saved folder are those of the model without the option). The PPO trainer
keeps one memory per env and replays it over sequences of `ppo.recurrence` steps
(`glam.ppo.trainer`); the evaluation harness keeps one per env slot (`glam.eval.agents`). The LSTM
cell keeps torch's initialisation, as in BabyAI (its initialiser only touches linear layers).

One deliberate difference: BabyAI normalises with `BatchNorm2d`; this model normalises each
example on its own (`GroupNorm` with one group: mean and variance over its channels and cells).
The PPO trainer samples actions in eval mode over the batch of envs and recomputes log-probs in
train mode over shuffled minibatches: with batch statistics the two forwards would differ
(PPO's first ratio would not be 1), an env's action would depend on the other envs of its
batch, and evaluation would run on running averages the policy never acted with. Per-example
normalisation gives one function of the observation in every mode and batch.

The direction the agent faces is accepted (minigrid's observation carries it) and, as in
BabyAI, not used: the view is egocentric, and the GLAM levels need no compass.

A policy folder is `glam_policy.json` (`kind: "symbolic"`, the `symbolic` settings, `memory`
among them, the action words, the env it was trained on) and `model.safetensors`: no pickle, no
code. A folder saved before `memory` existed has no such key and loads as a memoryless policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX
from torch import Tensor, nn

from glam.baselines.config import SymbolicConfig
from glam.baselines.run_config import BaselineRunConfig
from glam.baselines.words import encode_texts
from glam.config import EnvConfig
from glam.envs import resolve_action_space
from glam.policy.files import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    check_words_and_env,
    env_record,
    load_weights,
    read_policy_config,
    save_policy_folder,
)
from glam.policy.heads import mlp
from glam.policy.output import PolicyOutput
from glam.runs.errors import SetupError

__all__ = [
    "WEIGHTS_FILE",
    "FiLM",
    "FiLMBlock",
    "ImageBOWEmbedding",
    "SymbolicActorCritic",
    "build_symbolic_policy",
    "resume_symbolic_policy",
]

ACTOR_OUTPUT_SCALE = 0.01
"""The actor's last layer starts this much smaller than BabyAI's unit-norm rows (Andrychowicz et
al. 2021, "What matters in on-policy RL"): with unit rows over 64 tanh units the first policy
had an entropy of 0.40 nats of the 1.10 of three uniform actions, and PPO rarely tried the
others (measured: 0.65 success after 26k frames on GoToRedBallNoDists)."""
CELL_VALUES = (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX))
"""How many values each channel of a minigrid cell takes: object type, colour, state."""


def init_linear(module: nn.Module) -> None:
    """BabyAI's initialisation of a linear layer: Gaussian rows scaled to unit norm, zero bias
    (each output starts with the variance of its input, whatever the width)."""
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight)
        with torch.no_grad():
            module.weight /= module.weight.norm(dim=1, keepdim=True)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


def _norm(channels: int) -> nn.GroupNorm:
    """Per-example normalisation over channels and cells (see the module docstring)."""
    return nn.GroupNorm(1, channels)


class ImageBOWEmbedding(nn.Module):
    """minigrid's `(B, W, H, 3)` cell codes -> `(B, dim, W, H)`: each channel's value has its
    own embedding, and a cell is the sum of its three (BabyAI 1.1's bag of words)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(sum(CELL_VALUES), dim)
        offsets = torch.tensor([0, CELL_VALUES[0], CELL_VALUES[0] + CELL_VALUES[1]])
        self.register_buffer("offsets", offsets, persistent=False)
        self.register_buffer("limits", torch.tensor(CELL_VALUES), persistent=False)

    def forward(self, images: Tensor) -> Tensor:
        codes = images.long()
        if codes.ndim != 4 or codes.shape[-1] != 3:
            raise ValueError(
                f"images must be (batch, width, height, 3) minigrid codes, got {tuple(images.shape)}"
            )
        outside = (codes < 0) | (codes >= self.limits)
        if outside.any():
            channel = int(outside.nonzero()[0, -1])
            raise ValueError(
                f"images hold a value outside minigrid's encoding in channel {channel} "
                f"(object, colour, state take 0..{[n - 1 for n in CELL_VALUES]})"
            )
        embedded = self.embedding(codes + self.offsets).sum(dim=3)  # (B, W, H, dim)
        return embedded.permute(0, 3, 1, 2)


class FiLM(nn.Module):
    """Feature-wise linear modulation (Perez et al. 2018): `gamma(c) * x + beta(c)`, one gamma
    and one beta per channel of `x`, both linear in the conditioning vector `c`."""

    def __init__(self, condition_dim: int, channels: int) -> None:
        super().__init__()
        self.gamma = nn.Linear(condition_dim, channels)
        self.beta = nn.Linear(condition_dim, channels)

    def forward(self, features: Tensor, condition: Tensor) -> Tensor:
        # features (B, C, W, H), condition (B, condition_dim)
        gamma = self.gamma(condition)[:, :, None, None]
        beta = self.beta(condition)[:, :, None, None]
        return gamma * features + beta


class FiLMBlock(nn.Module):
    """BabyAI's FiLM module: conv 3x3, norm, ReLU, conv 3x3, FiLM by the mission, norm, ReLU."""

    def __init__(self, channels: int, condition_dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.norm1 = _norm(channels)
        self.conv2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.film = FiLM(condition_dim, channels)
        self.norm2 = _norm(channels)

    def forward(self, features: Tensor, condition: Tensor) -> Tensor:
        hidden = torch.relu(self.norm1(self.conv1(features)))
        return torch.relu(self.norm2(self.film(self.conv2(hidden), condition)))


class SymbolicActorCritic(nn.Module):
    """BabyAI's actor-critic (see the module docstring): one logit per action word and a value,
    from the egocentric grid and the mission.

    `action_words` name the outputs, in order (the env's action space the policy acts in).
    """

    observation_kind = "grid"
    """What the policy reads: `glam.policy.observations.GridObservations`."""

    def __init__(self, cfg: SymbolicConfig, action_words: Sequence[str]) -> None:
        super().__init__()
        if not action_words:
            raise ValueError("a symbolic policy needs its action words (one output per action)")
        self.cfg = cfg
        self.action_words = list(action_words)
        self.training_env: dict[str, Any] | None = None
        """The settings of the env the policy was trained on (`EnvConfig`'s fields), when known."""
        dim = cfg.image_dim
        self.image_encoder = nn.Sequential(
            ImageBOWEmbedding(dim),
            nn.Conv2d(dim, dim, kernel_size=3, padding=1),
            _norm(dim),
            nn.ReLU(),
            nn.Conv2d(dim, dim, kernel_size=3, padding=1),
            _norm(dim),
            nn.ReLU(),
        )
        self.word_embedding = nn.Embedding(cfg.vocabulary_buckets, cfg.instr_dim, padding_idx=0)
        self.mission_rnn = nn.GRU(cfg.instr_dim, cfg.instr_dim, batch_first=True)
        self.film_blocks = nn.ModuleList(
            FiLMBlock(dim, cfg.instr_dim) for _ in range(cfg.film_layers)
        )
        self.memory_size = 2 * dim if cfg.memory else 0
        """Numbers of memory each env carries from one step to the next, `(h, c)` of the LSTM
        cell; 0 without memory (then `forward` takes none and returns none)."""
        if cfg.memory:  # only then: a memoryless policy draws its weights as it always did
            self.memory_rnn = nn.LSTMCell(dim, dim)
        self.actor = mlp(dim, [cfg.hidden_dim], len(self.action_words), "tanh")
        self.critic = mlp(dim, [cfg.hidden_dim], 1, "tanh")
        self.apply(init_linear)
        with torch.no_grad():  # a near-uniform first policy, so that PPO explores every action
            self.actor[-1].weight.mul_(ACTOR_OUTPUT_SCALE)

    @property
    def device(self) -> torch.device:
        return self.actor[0].weight.device

    @torch.no_grad()
    def reset_action_outputs(self, indices: Sequence[int]) -> None:
        """Forget what was learned of the actions at `indices` (their slot now holds another
        coded action, `glam.codeact`): their logits start again from 0 in every state, as the
        first policy's near-zero ones did (the same on every process, with no random draw)."""
        for i in indices:
            self.actor[-1].weight[i].zero_()
            self.actor[-1].bias[i].zero_()

    def encode_missions(self, missions: Sequence[str]) -> Tensor:
        """`(B, instr_dim)`: the GRU's output after each mission's last word."""
        ids, lengths = encode_texts(missions, self.cfg.vocabulary_buckets)
        outputs, _ = self.mission_rnn(self.word_embedding(ids.to(self.device)))
        # Padding comes after the last word, so the output there has not read any of it.
        return outputs[torch.arange(len(missions), device=self.device), lengths.to(self.device) - 1]

    def forward(
        self,
        images: Tensor,
        directions: Tensor,
        missions: Sequence[str],
        memory: Tensor | None = None,
    ) -> PolicyOutput:
        """Action logits `(B, A)`, values `(B,)`, an all-True mask `(B, A)` and, with memory,
        the memory after this step `(B, memory_size)`.

        Args:
            images: `(B, 7, 7, 3)` minigrid codes (`GridObservations.images`), on any device.
            directions: `(B,)` the agent's direction; not used (the view is egocentric).
            missions: the B mission texts.
            memory: `(B, memory_size)` each env's memory before this step, on any device: the
                `memory` of its previous step's output, zero where an episode starts; None: zero
                for all. Only for a policy with memory.
        """
        if not (len(images) == len(directions) == len(missions)):
            raise ValueError(
                f"one image, direction and mission per env: got {len(images)} images, "
                f"{len(directions)} directions, {len(missions)} missions"
            )
        if memory is not None and not self.memory_size:
            raise ValueError("this policy has no memory (symbolic.memory=false): pass memory=None")
        if memory is not None and tuple(memory.shape) != (len(missions), self.memory_size):
            raise ValueError(
                f"memory must be (batch, memory_size) = ({len(missions)}, {self.memory_size}), "
                f"got {tuple(memory.shape)}"
            )
        condition = self.encode_missions(missions)
        features = self.image_encoder(images.to(self.device))
        for block in self.film_blocks:
            features = features + block(features, condition)
        embedding = torch.relu(features.amax(dim=(2, 3)))  # (B, image_dim)
        next_memory = None
        if self.memory_size:
            if memory is None:
                memory = embedding.new_zeros(len(missions), self.memory_size)
            hidden, cell = memory.to(embedding.device, embedding.dtype).chunk(2, dim=1)
            hidden, cell = self.memory_rnn(embedding, (hidden, cell))
            embedding, next_memory = hidden, torch.cat([hidden, cell], dim=1)
        logits = self.actor(embedding)
        values = self.critic(embedding).squeeze(-1)
        mask = torch.ones_like(logits, dtype=torch.bool)
        return PolicyOutput(logits, values, mask, next_memory, features=embedding)

    # ----------------------------------------------------------------------------------------
    # Checkpoints
    # ----------------------------------------------------------------------------------------

    def save_pretrained(
        self, path: str | Path, *, training_env: EnvConfig | Mapping[str, Any] | None = None
    ) -> Path:
        """Write `glam_policy.json` and `model.safetensors` into the folder `path`.

        `training_env` (by default `self.training_env`) is recorded so that the folder, copied on
        its own, is still evaluated in the action space it was trained in.
        """
        meta = {
            "kind": "symbolic",
            "symbolic": asdict(self.cfg),
            "action_words": self.action_words,
            "env": env_record(training_env) or self.training_env,
        }
        return save_policy_folder(path, self, meta)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, *, training_env: EnvConfig | Mapping[str, Any] | None = None
    ) -> SymbolicActorCritic:
        """Restore a policy written by `save_pretrained` (`training_env` replaces its record).

        Raises:
            CheckpointError: a file of the folder is missing, truncated or malformed (named).
        """
        path = Path(path)
        file = path / CONFIG_FILE
        meta = read_policy_config(path)
        if meta.get("kind") != "symbolic":
            raise CheckpointError(f"{file}: kind={meta.get('kind')!r}, not a symbolic policy")
        check_words_and_env(file, meta)
        try:
            cfg = SymbolicConfig(**meta["symbolic"])
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{file}: malformed 'symbolic' settings: {error}") from None
        policy = cls(cfg, meta["action_words"])
        load_weights(policy, path, "'symbolic' settings")
        policy.training_env = env_record(training_env) or meta.get("env")
        return policy

    def start_from(self, path: str | Path) -> None:
        """Take the acting weights of the network saved in `path` (`save_pretrained`: a clone's
        `clone.output_dir/policy`, a run's checkpoint policy): everything but the critic, which
        stays this network's own, untrained. A warm start of PPO (`train.init_policy`).

        Raises:
            CheckpointError: a file of the folder is missing, truncated or malformed.
            ValueError: the saved network is another one (its `symbolic` settings or its
                actions differ: the message lists how).
        """
        saved = SymbolicActorCritic.from_pretrained(path)
        ours, theirs = asdict(self.cfg), asdict(saved.cfg)
        differences = [
            f"symbolic.{key}={theirs[key]!r} there, {ours[key]!r} here"
            for key in ours
            if theirs[key] != ours[key]
        ]
        if saved.action_words != self.action_words:
            differences.append(f"actions {saved.action_words} there, {self.action_words} here")
        if differences:
            raise ValueError(f"{path} holds another network: {'; '.join(differences)}")
        acting = {k: v for k, v in saved.state_dict().items() if not k.startswith("critic.")}
        self.load_state_dict(acting, strict=False)


def build_symbolic_policy(cfg: BaselineRunConfig, checkpoint: Path | None) -> SymbolicActorCritic:
    """The PPO trainer's `PolicyFactory` for `policy.kind=symbolic`: a fresh network of the
    `symbolic` settings over the env's actions (with `train.init_policy`, the acting weights of
    a saved one and a fresh critic), or the one saved in `checkpoint / "policy"`."""
    try:
        action_words = list(resolve_action_space(cfg.env.action_space).words)
    except ValueError as error:
        raise SetupError(str(error)) from None
    if checkpoint is not None:
        return resume_symbolic_policy(cfg, checkpoint)
    policy = SymbolicActorCritic(cfg.symbolic, action_words)
    policy.training_env = env_record(cfg.env)
    if cfg.train.init_policy:
        try:
            policy.start_from(cfg.train.init_policy)
        except (CheckpointError, ValueError) as error:
            raise SetupError(f"train.init_policy: {error}") from None
    return policy


def resume_symbolic_policy(cfg: BaselineRunConfig, checkpoint: Path) -> SymbolicActorCritic:
    """The symbolic network saved in `checkpoint / "policy"`, for the run `cfg` resumes.

    Raises:
        SetupError: the folder does not load, or its network has memory and the run's
            `symbolic.memory` says none, or the reverse (a checkpoint written before the key
            existed has no record of it in its config.yaml: its policy folder decides).
    """
    folder = checkpoint / "policy"
    try:
        policy = SymbolicActorCritic.from_pretrained(folder, training_env=cfg.env)
    except CheckpointError as error:
        raise SetupError(f"cannot resume: {error}") from None
    if policy.cfg.memory != cfg.symbolic.memory:
        saved = "with" if policy.cfg.memory else "without"
        raise SetupError(
            f"cannot resume: {folder} holds a network {saved} memory, the run has "
            f"symbolic.memory={str(cfg.symbolic.memory).lower()}"
        )
    return policy
