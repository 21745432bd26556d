"""Off-policy learning of the scoring policies: discrete Soft Actor-Critic over the candidate
actions (SAC-GLAM's learner), its n-step returns and its losses, as pure tensor functions.

- `glam.offpolicy.returns`: n-step returns of stored steps, across episode ends and time-outs.
- `glam.offpolicy.sac`: the soft state value, the critics' targets and losses, the actor's and
  the entropy temperature's losses, Polyak averaging of the target critics.
"""
