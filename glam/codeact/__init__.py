"""RL-GPT's coded actions: Python functions over a small view of the env (`api`), run in a
restricted worker process (`sandbox`), offered to the policy as extra named actions next to the
primitive ones (`env`); `library` holds our skills written as coded actions."""
