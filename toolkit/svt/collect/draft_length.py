"""AV+length live: each row stops drafting at its own causal length, one position at a time.

The rule is the replay's (``svt.simulate.av.draft_lengths``): after drafting position j, a row
drafts j + 1 while the predicted marginal tokens of one more draft — its survival so far (the
product of its confidences) times the predictor's mean confidence at j + 1 — are worth more, at
the batch's plain-decoding rate, than one more verified token plus its share of the extra draft
pass. The mean confidence per position and how many rows share each pass are learned from this
run's earlier steps (per batch size), as the replay learns them from earlier steps of the trace;
before any step the predictor's confidence is taken as 1 (draft on) and every row shares a pass.
A row's length depends only on its own drafts' q, so verification stays lossless.
"""

from __future__ import annotations

import numpy as np
import torch

from svt.collect.sampling import q_stats
from svt.simulate.steps import verify_curve


class LengthPolicy:
    """The run's state: mean confidence per position and rows sharing each pass, by batch size."""

    def __init__(self, av):
        self.av = av
        self.sum = None  # [K] confidence sums over drafted positions
        self.count = None
        self.sharing: dict[int, np.ndarray] = {}

    def next_conf(self, K: int) -> np.ndarray:
        if self.sum is None:
            return np.ones(K)
        return np.where(self.count > 0, self.sum / np.maximum(self.count, 1), 1.0)

    def start(self, nb: int, K: int) -> Step:
        return Step(self, nb, K)


class Step:
    """One engine step's stopping decisions (``go_on`` after each drafted position)."""

    def __init__(self, policy: LengthPolicy, nb: int, K: int):
        self.policy, self.nb, self.K = policy, nb, K
        costs = policy.av.costs
        verify = verify_curve(costs, nb, nb * K, True)
        self.rate = nb / float(verify[0])
        self.per_token = float(verify[1] - verify[0])
        self.share = policy.sharing.get(nb, np.full(K, float(nb)))
        self.next = policy.next_conf(K)
        self.lengths = np.ones(nb, dtype=np.int64)
        self.surv = np.ones(nb)
        self.conf: list[np.ndarray] = []
        self.stats: list[dict[str, torch.Tensor]] = []  # q_stats of each drafted position, [nb] each

    def _confidence(self, i: int, q: torch.Tensor) -> np.ndarray:
        self.stats.append(q_stats(q))
        feats = {k: v.float().cpu().numpy()[:, None] for k, v in self.stats[-1].items()}
        return np.asarray(self.policy.av.confidence(feats, np.full((self.nb, 1), i)), dtype=np.float64)[:, 0]

    def step_stats(self, q: torch.Tensor) -> dict[str, torch.Tensor]:
        """``q_stats(q)`` of the step's drafts ``q`` ``[nb, L, V]`` ([nb, L] each), from the
        positions already scored (the last one scored here when no decision asked for it)."""
        if len(self.conf) < q.shape[1]:
            self.conf.append(self._confidence(q.shape[1] - 1, q[:, -1]))
        return {k: torch.stack([s[k] for s in self.stats], 1) for k in self.stats[0]}

    def go_on(self, i: int, q: torch.Tensor) -> bool:
        """After drafting position ``i`` (its distributions ``q`` [nb, V]): which rows draft i + 1;
        True while any does."""
        c = self._confidence(i, q)
        self.conf.append(c)
        self.surv = self.surv * c
        costs = self.policy.av.costs
        extra_pass = (costs.draft(self.nb, i + 2) - costs.draft(self.nb, i + 1)) / max(1.0, self.share[i])
        worth = self.surv * self.next[i + 1] > (extra_pass + self.per_token) * self.rate
        self.lengths = np.where((self.lengths == i + 1) & worth, i + 2, self.lengths)
        return bool((self.lengths == i + 2).any())

    def observe(self, q: torch.Tensor) -> None:
        """After the step: the confidences of every drafted position join the means, and how many
        rows went on past each position the sharing at this batch size."""
        p = self.policy
        if len(self.conf) < q.shape[1]:  # the last drafted position's confidence (no decision was asked)
            self.step_stats(q)
        if p.sum is None:
            p.sum, p.count = np.zeros(self.K), np.zeros(self.K)
        for j, c in enumerate(self.conf):
            m = self.lengths > j
            p.sum[j] += c[m].sum()
            p.count[j] += m.sum()
        p.sharing[self.nb] = np.array([(self.lengths > j + 1).sum() for j in range(self.K)], dtype=np.float64)
