"""The agents GLAM is compared with, trained on the same envs and run folders: BabyAI's symbolic
actor-critic (`symbolic`, through the PPO trainer) and DRRN (`drrn`, its own TD learner)."""
