"""One forward step on the host: the step state, each sub-forward's phase and plan, the bracket around the model's
forward, and the sampled tokens the next forward checks against.
"""
