"""The randomness a tree step uses, behind two calls, so tests can enumerate it exactly."""

from __future__ import annotations

import numpy as np


class Draws:
    """``accept(prob)``: True with probability ``prob``; ``sample(probs)``: an index drawn from
    ``probs`` (non-negative, summing to 1)."""

    def __init__(self, seed: int | np.random.Generator = 0):
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def accept(self, prob: float) -> bool:
        return bool(self.rng.random() < prob)

    def sample(self, probs: np.ndarray) -> int:
        probs = np.asarray(probs, dtype=np.float64)
        return int(self.rng.choice(probs.size, p=probs / probs.sum()))
