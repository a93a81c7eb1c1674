"""The feature zoo: named acceptance features, each a polars expression over the drafts table.

Every feature says whether it is **lossless** (depends only on the draft distribution q and the
position, so trimming on it keeps speculative sampling exact) and whether it is already a
**probability** of acceptance (so log-loss and ECE are defined for it without a fitted predictor).

Add your own without editing svt: put functions in a module and name it with
``--feature-module my_pkg.feats``::

    # my_pkg/feats.py
    import polars as pl
    from svt.features import feature

    @feature(lossless=True, description="q_max squared")
    def qmax_sq() -> pl.Expr:
        return pl.col("q_max") ** 2

>>> from svt.features import get_feature
>>> get_feature("logit_qmax").lossless
True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from svt.errors import ConfigError, SvtError

EPS = 1e-6  # probabilities are clipped to [EPS, 1 - EPS] before logs
# what the target computed (its probabilities, the acceptance test): a lossless feature may read
# none of them (it would not be known before verifying), and no feature may read the label it scores
TARGET_COLUMNS = frozenset({"label", "p_sampled", "p_max", "accept_prob", "accept_prob_expected"})


@dataclass(frozen=True)
class Feature:
    name: str
    expr: pl.Expr
    description: str
    lossless: bool
    probability: bool = False  # already a probability of acceptance (log-loss/ECE defined)
    partial: bool = False  # scores only some rows (a fitted predictor's held-out rows); nulls skipped
    direction: int = 1  # +1: a higher value means "more likely accepted"; -1: a lower value does
    # the same values from numpy arrays of the q columns (optional): live AV scores a step's few drafts
    # with it inside the engine, where a polars query (~0.3 ms each) would cost a sizable share of a step
    numpy: Callable | None = None

    def __post_init__(self):
        if self.direction not in (1, -1):
            raise ConfigError(f"Feature {self.name!r}: direction must be 1 or -1, not {self.direction!r}.")
        if self.probability and self.direction != 1:
            raise ConfigError(f"Feature {self.name!r} is a probability of acceptance, so higher must mean "
                              "accept (direction=1).")
        reads = set(self.expr.meta.root_names())
        if "label" in reads:
            raise ConfigError(f"Feature {self.name!r} reads the column 'label', the outcome it would be "
                              "scored against: a feature may not see its own label.")
        if self.lossless and reads & TARGET_COLUMNS:
            raise ConfigError(f"Feature {self.name!r} is declared lossless but reads "
                              f"{', '.join(sorted(reads & TARGET_COLUMNS))}, computed by the target when it "
                              "verifies: declare it lossless=False.")

    @property
    def shown_as(self) -> str:
        """The name tables and figures show: a lower-is-accept feature is scored negated."""
        return self.name if self.direction == 1 else f"−{self.name}"


FEATURES: dict[str, Feature] = {}


def _clip(col: str) -> pl.Expr:
    return pl.col(col).cast(pl.Float64).clip(EPS, 1 - EPS)


def _logit(col: str) -> pl.Expr:
    p = _clip(col)
    return (p / (1 - p)).log()


_BUILTINS: set[str] = set()


def register(f: Feature, *, replace: bool = False) -> Feature:
    """Add a feature. A built-in's name is never taken over; ``replace`` lets a user module that is
    imported again re-register its own features."""
    if f.name in _BUILTINS:
        raise ConfigError(f"{f.name!r} is a built-in feature; give your feature another name.")
    if f.name in FEATURES and not replace:
        raise ConfigError(f"A feature named {f.name!r} is already registered.")
    FEATURES[f.name] = f
    return f


def _cannot(f: Feature, exc: Exception) -> ConfigError:
    if type(exc).__name__ == "ShapeError":
        return ConfigError(f"Feature {f.name!r} gives a column of another length than the drafts table: one "
                           "value per draft expected.")
    return ConfigError(f"Feature {f.name!r} cannot be computed on the drafts table "
                       f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}).")


#: how many drafts the early check of a feature reads (see :func:`check_feature`)
EARLY_CHECK_ROWS = 1000


def check_feature(f: Feature, frame: pl.DataFrame | pl.LazyFrame) -> None:
    """Before any work: ``f`` over a missing column, one whose values are not numbers (strings,
    lists), or one that fails on the first rows is one clear error naming it. Every value is checked
    again where it is computed (:func:`feature_values`)."""
    lazy = frame.lazy()
    names = lazy.collect_schema().names()
    for col in sorted(set(f.expr.meta.root_names()) & set(OPTIONAL_COLUMNS) - set(names)):
        raise ConfigError(f"Feature {f.name!r} reads `{col}`, which these drafts do not carry: only "
                          f"{OPTIONAL_COLUMNS[col]} logs it (in every run read together).")
    try:
        dtype = lazy.select(f.expr.alias("_x")).collect_schema()["_x"]
        feature_values(f, lazy.head(EARLY_CHECK_ROWS))
    except ConfigError:
        raise
    except Exception as exc:  # polars raises ColumnNotFoundError, InvalidOperationError, ...
        raise _cannot(f, exc) from None
    if not (dtype.is_numeric() or dtype == pl.Boolean or dtype == pl.Null):
        raise ConfigError(f"Feature {f.name!r} gives {dtype} values; a feature must give one number per draft.")


def feature_values(f: Feature, frame: pl.DataFrame | pl.LazyFrame, *, name: str = "_x") -> np.ndarray:
    """``f``'s value on every row of ``frame`` as float64 (null -> NaN). A failure on any row, values
    that are not numbers, or a result of another length than the frame's is one error naming ``f``."""
    try:  # with_columns: a result of another length is polars' ShapeError; a constant is broadcast
        col = frame.lazy().with_columns(f.expr.alias(name)).select(name).collect()[name]
    except Exception as exc:  # polars: a cast that fails on some row, a shape error, a user function's error
        raise _cannot(f, exc) from None
    if not (col.dtype.is_numeric() or col.dtype in (pl.Boolean, pl.Null)):
        raise ConfigError(f"Feature {f.name!r} gives {col.dtype} values; a feature must give one number per draft.")
    return col.cast(pl.Float64).to_numpy()


def feature(*, lossless: bool, description: str = "", probability: bool = False,
            name: str | None = None, direction: int = 1) -> Callable:
    """Decorator: register a function returning a polars expression as a feature. ``direction=-1``
    declares a feature whose *lower* values mean acceptance (like entropy): svt scores it negated so
    that every AUC in a report reads "higher = better", and keeps the raw AUC as ``auc_raw``."""

    def wrap(fn: Callable[[], pl.Expr]):
        expr = fn()
        if not isinstance(expr, pl.Expr):
            raise ConfigError(f"Feature function {fn.__name__} must return a polars expression.")
        register(Feature(name or fn.__name__, expr, description or (fn.__doc__ or "").strip(),
                         lossless, probability, direction=direction), replace=True)
        return fn

    return wrap


def get_feature(name: str) -> Feature:
    """The feature by name; an unknown name lists the known ones."""
    try:
        return FEATURES[name]
    except KeyError:
        raise ConfigError(
            f"Unknown feature {name!r}; known features: {', '.join(sorted(FEATURES))}."
        ) from None


def load_feature_module(module: str) -> list[str]:
    """Import a user module whose ``@feature`` functions register themselves; return new names."""
    import os
    import sys

    before = set(FEATURES)
    if os.getcwd() not in sys.path and "" not in sys.path:  # `--feature-module my_feats` from the current folder
        sys.path.insert(0, os.getcwd())
    try:
        importlib.import_module(module)
    except SvtError as exc:
        raise ConfigError(f"Feature module {module!r}: {' '.join(str(exc).split())}") from None
    except Exception as exc:  # a syntax error or anything the module raises while importing (one line)
        raise ConfigError(f"Could not import feature module {module!r}: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())}") from None
    return sorted(set(FEATURES) - before)


def _builtin(name, expr, description, lossless, probability=False, direction=1, numpy=None):
    register(Feature(name, expr, description, lossless, probability, direction=direction, numpy=numpy))
    _BUILTINS.add(name)


def _np_logit(q: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(q, dtype=np.float64), EPS, 1 - EPS)
    return np.log(p / (1 - p))


_builtin("q_max", pl.col("q_max").cast(pl.Float64),
         "draft's top-1 probability, used as is (the miscalibrated 'no fit' baseline)", True, True,
         numpy=lambda c: np.asarray(c["q_max"], dtype=np.float64))
_builtin("logit_qmax", _logit("q_max"),
         "log-odds of the draft's top-1 probability (the online estimator's feature)", True,
         numpy=lambda c: _np_logit(c["q_max"]))
_builtin("q_sampled", pl.col("q_sampled").cast(pl.Float64),
         "draft probability of the sampled token (depends on the token: lossy)", False, True)
_builtin("logit_qsampled", _logit("q_sampled"), "log-odds of q_sampled (lossy)", False)
_builtin("gumbel_qsampled", -(-_clip("q_sampled").log()).log(), "-log(-log q_sampled) (lossy)", False)
_builtin("entropy", pl.col("q_entropy").cast(pl.Float64),
         "entropy of the draft distribution, nats (lower = more likely accepted: scored negated)", True,
         direction=-1)
_builtin("neg_entropy", -pl.col("q_entropy").cast(pl.Float64),
         "minus the draft entropy (ranks in the direction of acceptance)", True)
_builtin("margin", pl.col("q_margin").cast(pl.Float64), "top-1 minus top-2 draft probability", True)
_builtin("logit_margin",
         (_clip("q_max").log() - (pl.col("q_max") - pl.col("q_margin")).cast(pl.Float64)
          .clip(EPS, 1).log()).clip(upper_bound=40.0),
         "top-2 logit margin log q1 - log q2, capped at 40 (vLLM's online-estimator variant)", True)
_builtin("position", pl.col("position").cast(pl.Float64), "draft position (0-based)", True)
_builtin("confidence", pl.col("confidence").cast(pl.Float64),
         "the drafter's own confidence head (DSpark, trained with it): its probability that the draft is "
         "accepted given the drafts before it were, from the slot's hidden state and the previous token "
         "(never the drafted one: lossless as q_max is); only runs whose drafter has one carry the column", True,
         True, numpy=lambda c: np.asarray(c["confidence"], dtype=np.float64))
_builtin("logit_confidence", _logit("confidence"),
         "log-odds of the drafter's confidence head (the online estimator on it: a temperature and "
         "per-position offsets, as TensorRT-LLM calibrates the head with a temperature)", True,
         numpy=lambda c: _np_logit(c["confidence"]))

#: features that read a column only some runs carry (the schema's optional columns): column -> what logs it
OPTIONAL_COLUMNS = {"confidence": "a drafter with a confidence head (DSpark with enable_confidence_head)"}


def run_features(carried: set[str]) -> tuple[str, ...]:
    """The features a report scores by default on runs that carry the optional columns ``carried``:
    :data:`DEFAULT_FEATURES`, then each optional column's own feature (``confidence``)."""
    return (*DEFAULT_FEATURES, *[c for c in OPTIONAL_COLUMNS if c in carried])

BUILTIN = tuple(FEATURES)
DEFAULT_FEATURES = ("q_max", "logit_qmax", "q_sampled", "logit_qsampled", "gumbel_qsampled",
                    "entropy", "margin", "logit_margin")
