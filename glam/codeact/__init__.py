"""RL-GPT's coded actions: Python functions over a small view of the env (`api`), run in a
restricted worker process (`sandbox`), offered to the policy as extra named actions next to the
primitive ones (`env`); `library` holds our skills written as coded actions.

Around them, RL-GPT's two agents and its critic: the slow agent (`planner`) chooses which
sub-actions of a mission family to code and which to leave to RL, the fast agent (`writer`)
writes their code (library skills, or a chat model's functions) through the sandbox's
`validate`, and the critic (`critic`) keeps, drops or rewrites each coded action from its
statistics over an RL phase and records every outer iteration in the run folder."""
