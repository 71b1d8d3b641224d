"""One forward step on the host: the step state, each sub-forward's phase and plan, the bracket around the model's
forward, the sampled tokens the next forward checks against, and an EAGLE draft that follows its target.
"""
