"""LLM4RL: an LLM planner gives subgoals that skills carry out, and a mediator policy trained by
RL with a cost per query learns when asking the planner pays (`planner`, `mediated`, `hook`)."""
