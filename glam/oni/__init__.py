"""ONI: an LLM's asynchronous labels of the agent's events, distilled into an intrinsic reward."""
