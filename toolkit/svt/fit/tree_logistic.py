"""``tree-logistic``: a node acceptance predictor trained on a tree run's ``tree_drafts`` table, for
growing and pruning draft trees.

Logistic regression (scikit-learn, L2, C = 1) of a node's conditional acceptance on the drafter's
view of it (:func:`svt.trees.predictor.node_features`: logits of q_token and q_max, entropy, log
path probability, one-hot depth and sibling rank). On greedy runs the label is ``match`` (the
token is the target's argmax at its parent), known for every node; on sampling runs it is
``label`` on the nodes verification tried (accepted given reached). The product of its
probabilities down a path is the predicted path acceptance the tree report grows trees by.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from svt.errors import DataError
from svt.fit.base import FitData, Fitter, register_fitter
from svt.fit.files import finite, names
from svt.trees.predictor import MAX_ONE_HOT, node_features

NODE_COLUMNS = ("q_token", "q_max", "q_entropy", "path_prob", "depth", "rank")
FEATURE_NAMES = ("logit_q_token", "logit_q_max", "q_entropy", "log_path_prob",
                 *(f"depth_{d}" for d in range(1, MAX_ONE_HOT)), *(f"rank_{r}" for r in range(1, MAX_ONE_HOT)))


def node_target(frame: pl.DataFrame, greedy: bool) -> tuple[pl.DataFrame, np.ndarray]:
    """The rows a node predictor learns from and their 0/1 targets (see the module doc)."""
    if greedy:
        rows = frame.filter(pl.col("match").is_not_null())
        return rows, rows["match"].to_numpy().astype(np.int64)
    rows = frame.filter(pl.col("label").is_not_null())
    return rows, rows["label"].to_numpy().astype(np.int64)


def node_matrix(frame: pl.DataFrame) -> np.ndarray:
    x = node_features({c: frame[c].to_numpy() for c in NODE_COLUMNS})
    if not np.isfinite(x).all():
        raise DataError("Tree-node features hold NaN/inf values; cannot fit or predict on them.")
    return x


@register_fitter
class TreeLogistic(Fitter):
    name = "tree-logistic"
    table = "tree_drafts"
    target = "node acceptance"
    supports_live = False
    lossless = True  # it only chooses which nodes to draft: verification stays exact

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.feature = "tree nodes"
        self.features = list(FEATURE_NAMES)

    def label(self) -> str:
        return self.name

    def check(self) -> None:
        if list(self.features) != list(FEATURE_NAMES):
            raise DataError(f"This tree-logistic fit names features {self.features}; this svt computes "
                            f"{list(FEATURE_NAMES)}.")

    def fit(self, data: FitData) -> TreeLogistic:
        from sklearn.linear_model import LogisticRegression

        greedy = bool(data.frame["_greedy"][0])
        rows, y = node_target(data.frame, greedy)
        if y.size == 0 or y.min() == y.max():
            raise DataError(f"Only one class among the {y.size} training nodes: a node predictor cannot be fitted.")
        model = LogisticRegression(C=1.0, max_iter=2000).fit(node_matrix(rows), y)
        self.coef_, self.intercept_ = model.coef_[0].astype(np.float64), float(model.intercept_[0])
        self.label_ = "match (every node)" if greedy else "accepted given tried"
        return self

    def predict(self, frame: pl.DataFrame, ctx=None) -> np.ndarray:
        z = node_matrix(frame) @ self.coef_ + self.intercept_
        return 1.0 / (1.0 + np.exp(-z))

    def summary(self) -> list[str]:
        return [f"label {self.label_}", f"coef {np.round(self.coef_[:4], 3).tolist()} (q_token, q_max, entropy, "
                f"log path prob) + depth and rank terms", f"intercept {self.intercept_:.3f}"]

    def to_dict(self) -> dict:
        return {"model": self.name, "features": self.features, "coef": self.coef_.tolist(),
                "intercept": self.intercept_, "label": self.label_, "options": {"C": 1.0}}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        n = len(names(d, "features"))
        finite(d, "coef", (n,), why=f"{n}, one per feature")
        finite(d, "intercept")
        if d.get("label") not in ("match (every node)", "accepted given tried"):
            from svt.errors import ConfigError

            raise ConfigError("`label` is not `match (every node)` or `accepted given tried`.")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> TreeLogistic:
        self = cls()
        self.features = list(d["features"])
        self.coef_ = np.asarray(d["coef"], dtype=np.float64)
        self.intercept_ = float(d["intercept"])
        self.label_ = d["label"]
        return self
