"""Suffix-match features of cache drafts: the inputs of yield predictors (Hybrid Verified Decoding).

Each is a polars expression over the ``cache_drafts`` table; every one is known before the draft is
verified (the table's columns are built that way; ``oracle_accepted`` and ``model_accepted`` are
labels, never features). Register more with ``register_cache_feature``.

>>> "log_match_len" in CACHE_FEATURES
True
"""

from __future__ import annotations

import polars as pl

from svt.errors import ConfigError

CACHE_FEATURES: dict[str, tuple[pl.Expr, str]] = {}


def register_cache_feature(name: str, expr: pl.Expr, description: str) -> None:
    if name in CACHE_FEATURES:
        raise ConfigError(f"A cache feature named {name!r} is already registered.")
    CACHE_FEATURES[name] = (expr, description)


def get_cache_features(names: list[str] | tuple[str, ...]) -> list[pl.Expr]:
    """The expressions of ``names`` (aliased to their names); an unknown name lists the known ones."""
    out = []
    for n in names:
        if n not in CACHE_FEATURES:
            raise ConfigError(f"Unknown cache feature {n!r}; known cache features: {', '.join(CACHE_FEATURES)}.")
        out.append(CACHE_FEATURES[n][0].cast(pl.Float64).alias(n))
    return out


def _col(name: str, description: str) -> None:
    register_cache_feature(name, pl.col(name), description)


_col("draft_len", "tokens in the cache draft")
_col("match_len", "length of the context suffix the draft was matched on")
register_cache_feature("log_match_len", (pl.col("match_len").cast(pl.Float64) + 1).log(), "log(1 + match_len)")
_col("score", "arctic-inference's score: sum of the draft tokens' estimated probabilities")
_col("prob_mean", "mean estimated probability of the draft tokens")
_col("prob_min", "smallest estimated probability among the draft tokens")
_col("from_global", "1 if the draft came from the global tree of finished responses")
_col("decode_pos", "output tokens generated so far")
_col("context_len", "prompt + output tokens so far")
_col("prev_draft_len", "draft length at the previous position")
_col("prev_match_len", "match length at the previous position")
_col("hist_draft_share", "share of the last positions where the cache had a draft")
_col("hist_yield_mean", "mean prefix of the last positions' drafts confirmed by tokens generated since")
_col("hist_yield_max", "largest such confirmed prefix")
for _w in ("draft", "ctx"):
    for _c in ("punct", "digit", "space", "newline", "bracket"):
        _col(f"{_w}_{_c}", f"share of {_c} characters in the {'draft' if _w == 'draft' else 'matched context'}")

YIELD_FEATURES = tuple(CACHE_FEATURES)
# of the position's tree cache draft (``cache_trees``): only tree yield fitters read them
_col("tree_size", "nodes in the tree cache draft")
_col("tree_score", "the tree's score: sum of its nodes' estimated probabilities")
TREE_FEATURES = ("tree_size", "tree_score")
# raw statistics scored as yield rules beside the fitted predictors (in tokens, like a yield)
YIELD_RULES = ("match_len", "score")
