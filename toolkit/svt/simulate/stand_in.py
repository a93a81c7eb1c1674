"""A stand-in model drafter: no model, only its conditional acceptance by position. Draft i is
accepted with probability ``accept[i]`` when drafts 0..i-1 were, drawn independently per position
from a seed and the request id (so the draws do not depend on batching). Reference runs use it as
their drafter, and the HVD map sweeps its strength."""

from __future__ import annotations

import numpy as np


def stand_in_yields(accept: np.ndarray, seed: int, request: int, n: int) -> np.ndarray:
    """The stand-in drafter's accepted length at each of ``n`` positions of one request: the run of
    successes of independent draws ``u_i < accept[i]``, capped at the tokens left (``n - t``)."""
    rng = np.random.default_rng([seed, request, 0x5D])
    hits = rng.random((n, accept.size)) < accept[None, :]
    runs = np.cumprod(hits, axis=1).sum(axis=1)
    return np.minimum(runs, n - np.arange(n)).astype(np.int64)


def expected_tokens_per_cycle(accept: np.ndarray) -> float:
    """1 + sum_i prod_{j<=i} accept[j]: the mean accepted length plus the target's own token."""
    return float(1.0 + np.cumprod(accept).sum())
