"""A node acceptance predictor for tree growth: logistic regression of a node's greedy ``match`` (its
token is the target's argmax at its parent) on the drafter's view of the node, cross-fitted over
requests so no node is scored by a model that saw it.

Features: logit of q_token, logit of q_max, entropy, log path probability, and one-hot depth and
sibling rank (capped), so the predictor can learn that deeper and lower-ranked nodes pay less than
their q says. The product of its probabilities along a path is its predicted path acceptance.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6
MAX_ONE_HOT = 8


def _logit(x: np.ndarray) -> np.ndarray:
    x = np.clip(x.astype(np.float64), EPS, 1 - EPS)
    return np.log(x / (1 - x))


def node_features(cols: dict[str, np.ndarray]) -> np.ndarray:
    depth = np.minimum(cols["depth"].astype(np.int64), MAX_ONE_HOT - 1)
    rank = np.minimum(cols["rank"].astype(np.int64), MAX_ONE_HOT - 1)
    eye = np.eye(MAX_ONE_HOT)
    return np.column_stack([_logit(cols["q_token"]), _logit(cols["q_max"]), cols["q_entropy"].astype(np.float64),
                            np.log(np.clip(cols["path_prob"].astype(np.float64), 1e-30, None)),
                            eye[depth][:, 1:], eye[rank][:, 1:]])


def cross_fitted_match(cols: dict[str, np.ndarray], groups: np.ndarray, folds: int = 2, seed: int = 0) -> np.ndarray:
    """P(match) for every node, each predicted by a model fitted on the other folds' requests."""
    from sklearn.linear_model import LogisticRegression

    x = node_features(cols)
    y = cols["match"].astype(np.int64)
    uniq = np.unique(groups)
    fold_of = dict(zip(uniq, np.random.default_rng(seed).permutation(uniq.size) % folds, strict=True))
    fold = np.array([fold_of[g] for g in groups])
    out = np.full(y.size, np.nan)
    for f in range(folds):
        train, test = fold != f, fold == f
        if not test.any():
            continue
        if np.unique(y[train]).size < 2:  # one class only: its rate
            out[test] = y[train].mean() if train.any() else 0.5
            continue
        model = LogisticRegression(C=1.0, max_iter=1000).fit(x[train], y[train])
        out[test] = model.predict_proba(x[test])[:, 1]
    return out
