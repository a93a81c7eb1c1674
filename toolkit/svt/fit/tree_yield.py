"""Yield predictors on tree cache drafts (``cache_trees``): the accepted length of a position's
SuffixDecoding tree draft (its deepest matched path), predicted before verification from the cache
features of the position plus the tree's size and score. The same three models as the chain yield
predictors (:mod:`svt.fit.yield_models`), trained on the training requests' positions that have a
tree; predictions are clipped to [0, tree_size]. `svt evaluate --costs` switches HVD on tree drafts
by them.
"""

from __future__ import annotations

from svt.features.cache import TREE_FEATURES, YIELD_FEATURES
from svt.fit.base import register_fitter
from svt.fit.yield_models import YieldGBM, YieldLinear, YieldMLP


class _OnTrees:
    table = "cache_trees"
    label_column = "tree_yield"
    size_column = "tree_size"
    default_features = (*YIELD_FEATURES, *TREE_FEATURES)


@register_fitter
class TreeYieldLinear(_OnTrees, YieldLinear):
    name = "tree-yield-linear"


@register_fitter
class TreeYieldGBM(_OnTrees, YieldGBM):
    name = "tree-yield-gbm"


@register_fitter
class TreeYieldMLP(_OnTrees, YieldMLP):
    name = "tree-yield-mlp"
