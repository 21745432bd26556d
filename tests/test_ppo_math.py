"""PPO's pure functions against values worked out by hand and by brute force."""

from __future__ import annotations

import math

import pytest
import torch

from glam.policy.observations import TextObservations
from glam.ppo.buffer import RolloutBuffer
from glam.ppo.gae import compute_gae
from glam.ppo.losses import explained_variance, normalize_advantages, ppo_loss


def _column(*values: float) -> torch.Tensor:
    return torch.tensor(values).unsqueeze(1)  # (steps, 1 env)


def test_gae_matches_hand_computation() -> None:
    # gamma 0.9, lambda 0.5: deltas 1.4, 0.35, 2.3, then A_t = delta_t + 0.45 A_{t+1}.
    advantages, returns = compute_gae(
        _column(1.0, 0.0, 2.0),
        _column(0.5, 1.0, 1.5),
        _column(0, 0, 0).bool(),
        torch.tensor([2.0]),
        gamma=0.9,
        gae_lambda=0.5,
    )
    assert advantages.squeeze(1).tolist() == pytest.approx([2.02325, 1.385, 2.3])
    assert returns.squeeze(1).tolist() == pytest.approx([2.52325, 2.385, 3.8])


def test_gae_does_not_bootstrap_across_episode_end() -> None:
    # The episode ends with the action of step 1: delta_1 = 0 - 1.0 and nothing flows back.
    advantages, _ = compute_gae(
        _column(1.0, 0.0, 2.0),
        _column(0.5, 1.0, 1.5),
        _column(0, 1, 0).bool(),
        torch.tensor([2.0]),
        gamma=0.9,
        gae_lambda=0.5,
    )
    assert advantages.squeeze(1).tolist() == pytest.approx([0.95, -1.0, 2.3])


def _brute_force_gae(rewards, values, dones, last_values, gamma, lam):
    steps, envs = rewards.shape
    out = torch.zeros(steps, envs, dtype=torch.float64)
    for env in range(envs):
        for t in range(steps):
            total, weight = 0.0, 1.0
            for k in range(t, steps):
                next_value = values[k + 1, env] if k + 1 < steps else last_values[env]
                alive = 0.0 if dones[k, env] else 1.0
                total += weight * (rewards[k, env] + gamma * next_value * alive - values[k, env])
                if not alive:
                    break
                weight *= gamma * lam
            out[t, env] = total
    return out


def test_gae_bootstraps_a_time_out_from_its_final_value() -> None:
    # One env, three steps; the episode is cut by the time limit at step 1 (final value 5).
    rewards = torch.tensor([[0.0], [0.0], [0.0]])
    values = torch.tensor([[1.0], [2.0], [3.0]])
    dones = torch.tensor([[False], [True], [False]])
    last = torch.tensor([4.0])
    final = torch.tensor([[0.0], [5.0], [0.0]])
    # By hand, gamma = lambda = 0.5:
    #   t=2: delta = 0 + 0.5 * 4 - 3 = -1                      A2 = -1
    #   t=1: delta = 0 + 0.5 * 5 - 2 = 0.5 (cut: no A2 term)   A1 = 0.5
    #   t=0: delta = 0 + 0.5 * 2 - 1 = 0                       A0 = 0 + 0.25 * 0.5 = 0.125
    adv, ret = compute_gae(
        rewards, values, dones, last, gamma=0.5, gae_lambda=0.5, final_values=final
    )
    assert adv.squeeze(1).tolist() == pytest.approx([0.125, 0.5, -1.0])
    assert ret.squeeze(1).tolist() == pytest.approx([1.125, 2.5, 2.0])
    # Without the bootstrap the time-out is terminal (GLAM): A1 = -2, A0 = 0.25 * -2.
    adv, _ = compute_gae(rewards, values, dones, last, gamma=0.5, gae_lambda=0.5)
    assert adv.squeeze(1).tolist() == pytest.approx([-0.5, -2.0, -1.0])
    with pytest.raises(ValueError, match="final_values"):
        compute_gae(rewards, values, dones, last, gamma=0.5, gae_lambda=0.5, final_values=final[:2])


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.9, 0.0), (0.8, 1.0)])
def test_gae_matches_brute_force_sum(gamma: float, lam: float) -> None:
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, 3, generator=generator, dtype=torch.float64)
    values = torch.randn(12, 3, generator=generator, dtype=torch.float64)
    dones = torch.rand(12, 3, generator=generator) < 0.25
    last_values = torch.randn(3, generator=generator, dtype=torch.float64)
    advantages, returns = compute_gae(
        rewards, values, dones, last_values, gamma=gamma, gae_lambda=lam
    )
    expected = _brute_force_gae(rewards, values, dones, last_values, gamma, lam)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gae_lambda_one_gives_discounted_returns() -> None:
    rewards = _column(0.0, 0.0, 1.0, 0.0)
    dones = _column(0, 0, 1, 0).bool()
    values = torch.zeros(4, 1)
    _, returns = compute_gae(rewards, values, dones, torch.tensor([5.0]), gamma=0.5, gae_lambda=1.0)
    assert returns.squeeze(1).tolist() == pytest.approx([0.25, 0.5, 1.0, 2.5])


def test_gae_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="same"):
        compute_gae(
            torch.zeros(3, 2),
            torch.zeros(3, 1),
            torch.zeros(3, 2),
            torch.zeros(2),
            gamma=0.9,
            gae_lambda=0.9,
        )


def _loss_inputs() -> dict[str, torch.Tensor]:
    return {
        "new_logprobs": torch.tensor([math.log(1.5), math.log(0.5)]),
        "old_logprobs": torch.zeros(2),
        "advantages": torch.tensor([1.0, -1.0]),
        "new_values": torch.tensor([1.0, 0.0]),
        "old_values": torch.zeros(2),
        "returns": torch.tensor([2.0, 1.0]),
        "entropy": torch.tensor([1.0, 0.5]),
    }


def test_ppo_loss_matches_hand_computation() -> None:
    # Ratios 1.5 (A=+1) and 0.5 (A=-1) are both clipped: policy terms -1.2 and 0.8.
    # Value: clipped prediction 0.5 for the first sample, error max(1, 2.25); second 1.
    loss, stats = ppo_loss(
        **_loss_inputs(), clip_eps=0.2, value_clip_eps=0.5, value_coef=0.5, entropy_coef=0.01
    )
    assert stats["policy"].item() == pytest.approx(-0.2)
    assert stats["value"].item() == pytest.approx(0.8125)
    assert stats["entropy"].item() == pytest.approx(0.75)
    assert stats["clip_fraction"].item() == pytest.approx(1.0)
    assert stats["approx_kl"].item() == pytest.approx(
        ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    )
    assert stats["ratio_max_deviation"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-0.2 + 0.5 * 0.8125 - 0.01 * 0.75)


def test_ppo_loss_without_value_clipping() -> None:
    _, stats = ppo_loss(
        **_loss_inputs(), clip_eps=0.2, value_clip_eps=None, value_coef=0.5, entropy_coef=0.0
    )
    assert stats["value"].item() == pytest.approx(0.5)


def test_ppo_loss_gradient_vanishes_only_where_clipped() -> None:
    # Sample 0: ratio 1.1 inside the clip range, gradient -A * r / N; sample 1: ratio 1.5 with
    # a positive advantage is clipped, no gradient.
    new_logprobs = torch.tensor([math.log(1.1), math.log(1.5)], requires_grad=True)
    loss, _ = ppo_loss(
        new_logprobs,
        torch.zeros(2),
        torch.tensor([2.0, 1.0]),
        torch.zeros(2),
        torch.zeros(2),
        torch.zeros(2),
        torch.zeros(2),
        clip_eps=0.2,
        value_clip_eps=0.2,
        value_coef=0.5,
        entropy_coef=0.0,
    )
    loss.backward()
    assert new_logprobs.grad.tolist() == pytest.approx([-2.0 * 1.1 / 2, 0.0])


def test_ratio_is_one_when_policies_match() -> None:
    logprobs = torch.randn(5)
    _, stats = ppo_loss(
        logprobs,
        logprobs.clone(),
        torch.randn(5),
        torch.zeros(5),
        torch.zeros(5),
        torch.zeros(5),
        torch.zeros(5),
        clip_eps=0.2,
        value_clip_eps=0.2,
        value_coef=0.5,
        entropy_coef=0.0,
    )
    assert stats["ratio_max_deviation"].item() == 0.0
    assert stats["approx_kl"].item() == 0.0
    assert stats["clip_fraction"].item() == 0.0


def test_normalize_and_explained_variance() -> None:
    advantages = torch.tensor([1.0, 2.0, 3.0, 4.0])
    normalized = normalize_advantages(advantages, advantages.mean(), advantages.std())
    assert normalized.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert normalized.std().item() == pytest.approx(1.0, abs=1e-6)
    targets = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(targets, targets) == pytest.approx(1.0)
    assert explained_variance(torch.full((3,), 2.0), targets) == pytest.approx(0.0)
    assert math.isnan(explained_variance(targets, torch.ones(3)))


def test_rollout_buffer_flattens_step_major() -> None:
    buffer = RolloutBuffer(num_steps=2, num_envs=3)
    for t in range(2):
        buffer.add(
            TextObservations([f"p{t}{i}" for i in range(3)], [["a", "b"]] * 3),
            torch.tensor([t, 1, 0]),
            torch.full((3,), -0.5),
            torch.arange(3.0) + 10 * t,
            torch.zeros(3),
            torch.tensor([False, t == 1, False]),
        )
    assert buffer.full
    with pytest.raises(IndexError):
        buffer.add(TextObservations(["x"] * 3, [["a"]] * 3), *[torch.zeros(3)] * 5)
    batch = buffer.transitions(torch.zeros(2, 3), torch.ones(2, 3))
    assert batch.observations.prompts == ["p00", "p01", "p02", "p10", "p11", "p12"]
    assert batch.values.tolist() == [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]
    minibatch = batch.select(torch.tensor([4, 0]))
    assert minibatch.observations.prompts == ["p11", "p00"]
    assert minibatch.actions.tolist() == [1, 0]


def test_gradient_split_matches_hand_computation() -> None:
    """A shared weight moves both the log-prob and the value, a second only the value (a value
    head's own): at ratio 1 the policy's gradient on the shared weight is -mean(A), the value's
    value_coef * mean(V - R); the second weight is left out of the split."""
    from glam.config import PPOConfig
    from glam.ppo.diagnostics import gradient_split

    shared = torch.tensor(0.3, requires_grad=True)
    head = torch.tensor(0.4, requires_grad=True)
    advantages = torch.tensor([1.0, -3.0])  # mean -1: the policy's gradient is +1
    returns = torch.tensor([0.2, 0.2])  # V - R = 0.5: the value's gradient is 0.5 * 0.5
    ppo = PPOConfig(value_coef=0.5, entropy_coef=0.0)

    def split(advantages: torch.Tensor, values: torch.Tensor) -> dict[str, float]:
        old_logprobs = torch.full((2,), 0.3)
        return gradient_split(
            shared.expand(2),
            old_logprobs,
            advantages,
            values,
            values.detach(),
            returns,
            torch.zeros(2),
            ppo,
            [shared, head],
        )

    both = split(advantages, (shared + head).expand(2))  # V = 0.7
    assert both["grad/policy_norm"] == pytest.approx(1.0)
    assert both["grad/value_norm"] == pytest.approx(0.25)
    assert both["grad/value_share"] == pytest.approx(0.0625 / 1.0625)
    assert both["grad/cosine"] == pytest.approx(1.0)  # both push the shared weight up
    assert shared.grad is None and head.grad is None  # a diagnostic: nothing accumulated
    # Advantages of the other sign: the policy pulls the shared weight the other way.
    assert split(-advantages, (shared + head).expand(2))["grad/cosine"] == pytest.approx(-1.0)
    # Nothing shared (a critic of its own): no split to report.
    assert all(math.isnan(v) for v in split(advantages, (head + 0.3).expand(2)).values())
