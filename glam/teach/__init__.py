"""LLM4Teach: a teacher (a language model weighing skills, or a control) distilled into a PPO student."""
