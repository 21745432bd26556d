"""SAC's trunk cache (glam/offpolicy/trunk_cache.py): the replayed observations' frozen states.

- A replayed batch takes the states held and computes the others; the forward from them equals
  the whole model's; an observation held runs no layer below the cut.
- bfloat16 entries take half of float32's memory and come back in the dtype they were computed
  in, the same numbers whether just computed or held; the least recently used entries go first
  past the budget; an entry is a copy of its own.
- The trainer turns it on where it applies and says so; a run from the cache kept as computed
  (`sac.trunk_cache_dtype=model`) trains as the run without it; where it does not apply, the run
  says why or stops; a resumed run starts it empty and says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from helpers_tiny import one_torch_thread  # noqa: F401  (autouse fixture: one torch thread)
from test_trunk import CANDIDATES, PROMPTS, _counting_calls, top_layers_policy

from glam.offpolicy.trainer import train_sac
from glam.offpolicy.trunk_cache import TrunkCache
from glam.policy.observations import TextObservations
from glam.ppo.logger import read_metrics
from glam.ppo.setup import build_policy
from glam.run_config import compose_run
from glam.runs.errors import SetupError
from glam.trunk import TrunkStates

OBS = TextObservations(PROMPTS, CANDIDATES)


def _full(policy, observations: TextObservations):  # noqa: ANN202
    with torch.no_grad():
        return policy(observations.prompts, observations.candidates)


def test_a_replayed_batch_takes_what_is_held_and_computes_the_rest() -> None:
    policy = top_layers_policy("llama", 2)
    cut = policy.enable_trunk_cache()
    cache = TrunkCache(2**30, dtype=None)
    cache.keep(OBS.select([0, 1]), _full(policy, OBS.select([0, 1])).trunk)
    assert len(cache) == 2

    batch = OBS.select([3, 1, 0, 2, 1])  # a replay draws with replacement
    attached = cache.attach(policy, batch)
    stats = cache.take_stats()
    assert (stats.hits, stats.misses) == (3, 2)
    assert len(cache) == 4
    with torch.no_grad():
        cached = policy(**attached.inputs())
    full = _full(policy, batch)
    torch.testing.assert_close(
        cached.logits[full.mask], full.logits[full.mask], rtol=1e-6, atol=1e-5
    )
    torch.testing.assert_close(cached.features, full.features, rtol=1e-6, atol=1e-5)

    below = _counting_calls(policy, cut)
    again = cache.attach(policy, batch)  # all held now: nothing below the cut runs
    with torch.no_grad():
        policy(**again.inputs())
    assert below["calls"] == 0
    assert cache.take_stats().hit_rate == 1.0


def test_bfloat16_entries_take_half_and_come_back_as_computed() -> None:
    policy = top_layers_policy("llama", 2)
    policy.enable_trunk_cache()
    kept = _full(policy, OBS).trunk
    exact, rounded = TrunkCache(2**30, dtype=None), TrunkCache(2**30)
    exact.keep(OBS, kept)
    rounded.keep(OBS, kept)
    assert rounded.nbytes * 2 == exact.nbytes == sum(states.nbytes for states in kept)
    attached = rounded.attach(policy, OBS)
    assert all(states.hidden.dtype == torch.float32 for states in attached.trunk)
    with torch.no_grad():
        from_bf16 = policy(**attached.inputs())
    full = _full(policy, OBS)
    difference = (from_bf16.logits - full.logits)[full.mask].abs().max().item()
    assert 0 < difference < 0.05 * full.logits[full.mask].abs().max().item()
    # A miss reads what a later hit will: the rounded states, not those just computed.
    empty = TrunkCache(2**30)
    computed = empty.attach(policy, OBS).trunk
    held = empty.attach(policy, OBS).trunk
    assert empty.take_stats().hits == len(OBS)
    for one, other, rounded in zip(computed, held, attached.trunk, strict=True):
        assert torch.equal(one.hidden, other.hidden) and torch.equal(one.hidden, rounded.hidden)


def _states(rows: int) -> TrunkStates:
    return TrunkStates(torch.ones(rows, 4))  # 16 bytes per row in float32


def _observations(*names: str) -> TextObservations:
    return TextObservations(list(names), [["go forward"]] * len(names))


class _NoForward(torch.nn.Module):
    def forward(self, **_: object) -> None:
        raise AssertionError("the cache ran the policy for an observation it holds")


def test_the_least_recently_used_go_first_past_the_budget() -> None:
    cache = TrunkCache(budget_bytes=2 * 160, dtype=None)  # two entries of 10 rows
    cache.keep(_observations("a", "b"), [_states(10), _states(10)])
    cache.attach(_NoForward(), _observations("a"))  # "a" used last: "b" is the oldest now
    cache.keep(_observations("c"), [_states(10)])
    assert len(cache) == 2 and cache.nbytes == 320
    cache.attach(_NoForward(), _observations("a", "c"))
    with pytest.raises(AssertionError, match="ran the policy"):
        cache.attach(_NoForward(), _observations("b"))
    cache.keep(_observations("d"), [_states(30)])  # larger than the whole budget: not kept
    assert len(cache) == 2 and cache.nbytes == 320
    with pytest.raises(ValueError, match="2 trunk states for 1"):
        cache.keep(_observations("e"), [_states(1), _states(1)])


def test_an_entry_is_a_copy_of_its_own() -> None:
    batch = torch.randn(100, 4)  # a forward's states are views of its batch's tensor
    cache = TrunkCache(2**20, dtype=None)
    cache.keep(_observations("a"), [TrunkStates(batch[:10])])
    batch.zero_()
    held = cache.attach(_NoForward(), _observations("a")).trunk[0].hidden
    assert held.abs().sum() > 0
    assert held.untyped_storage().nbytes() == 10 * 4 * 4


# --------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------

SAC_TINY = [
    "algorithm.name=sac",
    "env.num_envs=2",
    "sac.log_every=8",
    "sac.learning_starts=8",
    "sac.batch_size=8",
    "sac.update_every=2",
    "sac.critic_hidden_sizes=[16]",
    "train.total_frames=32",
    "train.save_every=0",
]


def _sac_run(tmp_path: Path, *overrides: str) -> tuple[list[dict], dict]:
    cfg = compose_run("tiny", [*SAC_TINY, *overrides])
    cfg.train.output_dir = str(tmp_path)
    train_sac(cfg, Accelerator(cpu=True), tmp_path, make_policy=build_policy)
    return read_metrics(tmp_path), yaml.safe_load((tmp_path / "config.yaml").read_text())


def test_sac_from_the_cache_trains_as_without_it(tmp_path: Path, capsys) -> None:
    rows, config = _sac_run(
        tmp_path / "cached", "model.lora.layers=1", "sac.trunk_cache_dtype=model"
    )
    assert "[glam] trunk cache: on; a gradient step runs the adapted layers only" in (
        capsys.readouterr().out
    )
    assert config["sac"]["cache_trunk"] is True
    plain, config = _sac_run(tmp_path / "plain", "model.lora.layers=1", "sac.cache_trunk=false")
    assert config["sac"]["cache_trunk"] is False
    assert "memory/trunk_cache_mib" not in plain[-1]
    assert rows[-1]["charts/gradient_steps"] == plain[-1]["charts/gradient_steps"] == 6
    assert 0 < rows[-1]["memory/trunk_cache_mib"] < 1
    # A replayed observation was played (held), or is what followed the newest step (not
    # played yet when the gradient steps are taken) or a timed-out episode's final one.
    assert 0.8 < rows[-1]["charts/trunk_cache_hit_rate"] < 1
    for name in ("losses/critic", "losses/actor", "losses/entropy", "charts/q_mean"):
        assert rows[-1][name] == pytest.approx(plain[-1][name], rel=1e-4, abs=1e-6), name


def test_where_the_cache_does_not_apply_the_sac_run_says_so_or_stops(
    tmp_path: Path, capsys
) -> None:
    _, config = _sac_run(tmp_path / "all")  # the tiny preset adapts both of its layers
    assert "[glam] trunk cache: off (LoRA adapts the lowest layer" in capsys.readouterr().out
    assert config["sac"]["cache_trunk"] is False
    with pytest.raises(SetupError, match="sac.cache_trunk=true, but sac.trunk_cache_mib=0"):
        _sac_run(
            tmp_path / "none",
            "model.lora.layers=1",
            "sac.cache_trunk=true",
            "sac.trunk_cache_mib=0",
        )
    with pytest.raises(ValueError, match="sac.trunk_cache_dtype must be one of bfloat16, model"):
        compose_run("tiny", ["sac.trunk_cache_dtype=float16"])


def test_a_resumed_run_starts_its_cache_empty_and_says_so(tmp_path: Path, capsys) -> None:
    _sac_run(tmp_path, "model.lora.layers=1", "train.total_frames=16")
    capsys.readouterr()
    rows, _ = _sac_run(tmp_path, "model.lora.layers=1", "train.resume=true")
    out = capsys.readouterr().out
    assert "empty at resume: it refills as the run replays" in out
    assert "sac.cache_trunk: True -> None" not in out  # unset again: not a change
    assert rows[-1]["frames"] == 32 and rows[-1]["memory/trunk_cache_mib"] > 0
