"""Discrete SAC's mathematics (glam/offpolicy), by hand on tiny cases: n-step returns across
episode ends and time-outs, the soft state value, the critics' targets and loss, the actor's
loss and the entropy temperature's gradient sign.

    .venv/bin/python -m pytest tests/test_sac_math.py
"""

from __future__ import annotations

import math

import pytest
import torch

from glam.offpolicy.returns import n_step_returns
from glam.offpolicy.sac import (
    actor_loss,
    critic_loss,
    critic_targets,
    policy_entropy,
    polyak_update,
    soft_state_values,
    temperature_loss,
)


def _steps(ends_by: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two envs, 5 steps. Env 0: rewards 1-5, its first episode ends at step 2 (`ends_by`
    terminated or truncated), the second goes on past the data. Env 1: rewards 10-50, one
    episode throughout."""
    rewards = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]])
    end = torch.zeros(5, 2, dtype=torch.bool)
    end[2, 0] = True
    none = torch.zeros(5, 2, dtype=torch.bool)
    return (rewards, end, none) if ends_by == "terminated" else (rewards, none, end)


def test_n_step_returns_stop_at_a_terminated_episode_without_bootstrap() -> None:
    out = n_step_returns(*_steps("terminated"), gamma=0.5, n=3)
    env0 = [
        (1 + 0.5 * 2 + 0.25 * 3, 2, False),  # t=0: three rewards, ends at 2
        (2 + 0.5 * 3, 2, False),  # t=1: two rewards, the episode ends
        (3.0, 2, False),  # t=2: the last step of the episode
        (4 + 0.5 * 5, 4, True),  # t=3: the data ends after two steps: bootstrap from 4's next
        (5.0, 4, True),
    ]
    for t, (value, last, bootstrap) in enumerate(env0):
        assert out.returns[t, 0].item() == pytest.approx(value)
        assert (out.last[t, 0].item(), out.bootstrap[t, 0].item()) == (last, bootstrap)
    assert out.discounts[:3, 0].tolist() == [0.0, 0.0, 0.0]  # no value after the task's end
    assert out.discounts[3:, 0].tolist() == [0.25, 0.5]
    # Env 1 (no end): three rewards, then gamma^3 V(next_obs of t+2); at the data's end fewer.
    assert out.returns[0, 1].item() == pytest.approx(10 + 0.5 * 20 + 0.25 * 30)
    assert out.returns[2, 1].item() == pytest.approx(30 + 0.5 * 40 + 0.25 * 50)
    assert out.last[:, 1].tolist() == [2, 3, 4, 4, 4]
    assert out.discounts[:, 1].tolist() == [0.125, 0.125, 0.125, 0.25, 0.5]
    assert out.bootstrap[:, 1].all()


def test_a_time_out_is_bootstrapped_from_the_episodes_final_observation() -> None:
    out = n_step_returns(*_steps("truncated"), gamma=0.5, n=3)
    # The same sums as a terminated episode, but each bootstraps from step 2's next_obs (the
    # final observation of the timed-out episode), discounted by the rewards it summed.
    assert out.returns[:3, 0].tolist() == pytest.approx([2.75, 3.5, 3.0])
    assert out.last[:3, 0].tolist() == [2, 2, 2] and out.bootstrap[:3, 0].all()
    assert out.discounts[:3, 0].tolist() == [0.125, 0.25, 0.5]


def test_one_step_returns_are_the_rewards() -> None:
    rewards, terminated, truncated = _steps("terminated")
    out = n_step_returns(rewards, terminated, truncated, gamma=0.9, n=1)
    assert torch.equal(out.returns, rewards)
    assert out.last[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert out.discounts[:, 0].tolist() == pytest.approx([0.9, 0.9, 0.0, 0.9, 0.9])
    with pytest.raises(ValueError, match="n >= 1"):
        n_step_returns(rewards, terminated, truncated, gamma=0.9, n=0)
    with pytest.raises(ValueError, match="share one"):
        n_step_returns(rewards, terminated[:, :1], truncated, gamma=0.9, n=2)


# Two candidates present of three: pi = (1/4, 3/4, absent).
LOGITS = torch.tensor([[0.0, math.log(3.0), 5.0]])
MASK = torch.tensor([[True, True, False]])
Q1 = torch.tensor([[1.0, 2.0, 100.0]])
Q2 = torch.tensor([[2.0, 0.0, 100.0]])  # min(q1, q2) = (1, 0) on the present candidates


def test_the_soft_state_value_by_hand() -> None:
    alpha = 0.5
    by_hand = 0.25 * (1 - alpha * math.log(0.25)) + 0.75 * (0 - alpha * math.log(0.75))
    assert soft_state_values(LOGITS, Q1, Q2, MASK, alpha).item() == pytest.approx(by_hand)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert policy_entropy(LOGITS, MASK).item() == pytest.approx(entropy)


def test_critic_targets_and_loss_by_hand() -> None:
    returns = torch.tensor([1.0, 2.0])
    discounts = torch.tensor([0.25, 0.0])
    bootstrap = torch.tensor([True, False])
    next_values = torch.tensor([4.0, float("nan")])  # never read where nothing bootstraps
    targets = critic_targets(returns, discounts, bootstrap, next_values)
    assert targets.tolist() == [2.0, 2.0]
    q1 = torch.tensor([[1.0, 3.0], [0.0, 5.0]], requires_grad=True)
    q2 = torch.tensor([[2.0, 2.0], [1.0, 1.0]], requires_grad=True)
    actions = torch.tensor([1, 0])
    # errors: q1 (3 - 2, 0 - 2), q2 (2 - 2, 1 - 2): half the mean of (1 + 0) and (4 + 1) = 1.5
    loss = critic_loss(q1, q2, actions, targets)
    assert loss.item() == pytest.approx(1.5)
    loss.backward()
    assert q1.grad.tolist() == [[0.0, 0.5], [-1.0, 0.0]]  # (q - y) / batch at the taken action


def test_the_actor_loss_by_hand_moves_only_the_policy() -> None:
    logits = LOGITS.clone().requires_grad_(True)
    q1, q2 = Q1.clone().requires_grad_(True), Q2.clone()
    alpha = 0.5
    loss = actor_loss(logits, q1, q2, MASK, alpha)
    by_hand = 0.25 * (alpha * math.log(0.25) - 1) + 0.75 * (alpha * math.log(0.75) - 0)
    assert loss.item() == pytest.approx(by_hand)
    loss.backward()
    assert q1.grad is None  # the critics are held fixed
    # d/dz_i sum_a pi_a (alpha log pi_a - q_a) = pi_i (alpha log pi_i - q_i - loss)
    expected = [
        0.25 * (alpha * math.log(0.25) - 1 - by_hand),
        0.75 * (alpha * math.log(0.75) - by_hand),
    ]
    assert logits.grad[0, :2].tolist() == pytest.approx(expected)
    assert logits.grad[0, 2].item() == 0.0  # the absent candidate
    # A descent step raises the logit of the candidate the critics value more (the first,
    # min q 1 against 0) and lowers the other's.
    assert logits.grad[0, 0] < 0 < logits.grad[0, 1]


@pytest.mark.parametrize(("entropy", "direction"), [(0.2, "up"), (1.0, "down")])
def test_the_temperature_rises_below_the_target_entropy(entropy: float, direction: str) -> None:
    log_alpha = torch.tensor(0.0, requires_grad=True)
    temperature_loss(log_alpha, torch.tensor([entropy, entropy]), target_entropy=0.6).backward()
    step = -log_alpha.grad.item()  # a gradient-descent step on log(alpha)
    assert step > 0 if direction == "up" else step < 0
    assert log_alpha.grad.item() == pytest.approx(entropy - 0.6)


def test_polyak_update_by_hand() -> None:
    target = [torch.nn.Parameter(torch.tensor([0.0, 10.0]))]
    source = [torch.nn.Parameter(torch.tensor([1.0, 20.0]))]
    polyak_update(target, source, tau=0.1)
    assert target[0].tolist() == pytest.approx([0.1, 11.0])
    polyak_update(target, source, tau=1.0)
    assert target[0].tolist() == [1.0, 20.0]
    with pytest.raises(ValueError, match="tau in"):
        polyak_update(target, source, tau=0.0)
