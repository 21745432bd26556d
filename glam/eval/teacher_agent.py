"""The teacher alone as an agent of the evaluation harness (`agent.kind=teacher`): what the
student is distilled from, played on its own, to show whether the student surpasses it."""

from __future__ import annotations

import torch

from glam.eval.agents import ActRequest, Agent, Decision, choose_actions
from glam.teach.teacher import Teacher


class TeacherAgent(Agent):
    """Acts by the teacher's action distribution: its argmax (greedy) or a sample; a state
    without advice gets a uniform choice. Like BabyAI's bot it reads the grid (through the
    skills), and its actions map to the suite's action space."""

    def __init__(self, name: str, teacher_factory, *, greedy: bool) -> None:
        """`teacher_factory(minigrid_actions)` builds the teacher for an action space."""
        self.name = name
        self.greedy = greedy
        self._factory = teacher_factory
        self._teachers: dict[tuple[int, ...], Teacher] = {}

    def act(self, request: ActRequest) -> list[Decision]:
        space = tuple(request.envs[0].action_space_def.minigrid_actions)
        if space not in self._teachers:  # a suite with other actions gets its own
            self._teachers[space] = self._factory(space)
        teacher = self._teachers[space]
        probs, _ = teacher.distributions(request.envs, request.slots, request.new_episode)
        # log(0) = -inf: an action the teacher rules out is never sampled nor chosen.
        actions = choose_actions(torch.log(probs), request.rngs, greedy=self.greedy)
        teacher.record_actions(request.slots, actions)
        return [Decision(action) for action in actions]

    def close(self) -> None:
        for teacher in self._teachers.values():
            teacher.close()
        self._teachers.clear()
