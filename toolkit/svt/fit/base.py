"""The fitter contract and its registry: one small estimator class per fitter, found by name.

A fitter follows scikit-learn's estimator shape: ``__init__`` stores options only; ``fit(data)``
learns and returns ``self`` (learned attributes end with ``_``); ``predict(frame, ctx)`` returns one
number per row (an acceptance probability, or a predicted yield for cache-draft fitters).
``svt.fit.fit_runs`` returns a fitted object whose ``training_`` says what it was trained on;
``save(path)`` writes it as a fit file and ``Fitter.load(path)`` reads one back as its own class.
A subclass gives the file its own keys with ``to_dict()`` / ``from_dict(d, path)`` and checks them
on load with ``check_fields(d)`` (helpers in ``svt.fit.files``). Adding a fitter
is one new module with a class decorated by ``@register_fitter`` and one import line in
``svt/fit/__init__.py``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError, SvtError
from svt.features import get_feature
from svt.fileio import json_text, read_json, write_text_atomic, writing
from svt.fit.files import check_fit_out, training_problem


@dataclass
class FitData:
    """What a fitter trains on: ``frame`` (labelled drafts of the training requests in replay order,
    or the cache-draft rows of the training requests), the max draft length ``k``, the run paths
    (for tables beside the drafts, e.g. hidden states) and the seed."""

    frame: pl.DataFrame
    k: int
    runs: list[Path] = field(default_factory=list)
    seed: int = 0


@dataclass
class PredictContext:
    """What predicting may need besides the rows: the runs they come from (a head reads hidden
    states) and ``k`` of the run."""

    runs: list[Path] | None = None
    k: int | None = None


class Fitter:
    """Base class. Subclasses set ``name`` and, when they differ from the defaults, ``table``
    (``drafts`` or ``cache_drafts``), ``target`` (``acceptance`` or ``yield``) and ``online``
    (evaluated prequentially on every row instead of on held-out requests)."""

    name: ClassVar[str] = ""
    table: ClassVar[str] = "drafts"
    target: ClassVar[str] = "acceptance"
    online: ClassVar[bool] = False
    streams: ClassVar[bool] = False  # an online fitter that trains from replay arrays (fit_arrays)
    supports_live: ClassVar[bool] = True  # scores live AV in the collector from q features alone
    plot_kinds: ClassVar[tuple[str, ...]] = ()  # figures drawn from the fit file itself (`svt plot`)
    model_file: ClassVar[bool] = False  # its fit file has a model file beside it (save_extra)
    extra_flags: ClassVar[tuple[str, ...]] = ()  # options it takes through an options object
    row_wise: ClassVar[bool] = False  # predicts each drafts row from its own columns (a cluster scores it shard by shard)

    # what fitting (svt.fit.fit_runs) or loading sets besides the learned parameters
    training_: dict | None = None  # runs, rows, k, split, evaluation (the fit file's `training`)
    created_: str | None = None  # when it was fitted (UTC, ISO 8601)
    svt_version_: str | None = None  # the svt that fitted it
    file_: Path | None = None  # the fit file it was read from or last written to

    def summary(self) -> list[str]:
        """What `svt fit` says of a fit it wrote, beyond its name and data (coefficients, training)."""
        d = self.to_dict()
        what = []
        slope = d.get("slope")
        if slope is not None:
            what.append(f"slope {np.round(slope, 4).tolist()}")
        if d.get("intercepts"):
            what.append(f"intercepts {[round(b, 4) for b in d['intercepts']]}")
        return what

    @classmethod
    def from_options(cls, **options) -> Fitter:
        """Build from the CLI's options: ``None`` means "not given" (the fitter's default); an option
        given that this fitter's ``__init__`` does not take is refused, never dropped. ``seed``
        seeds the request split of every fit, so every fitter accepts it."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self"}
        given = {k: v for k, v in options.items() if v is not None}
        if "feature" in given and "features" in given:
            raise ConfigError("Give --feature or --features, not both.")
        if "feature" in given and "feature" not in names:
            raise ConfigError(f"{cls.name!r} takes no --feature"
                              + (" (use --features to choose cache features)." if "features" in names else "."))
        unknown = sorted(k for k in given if k not in names and k != "seed")
        if unknown:
            raise cls.refuse([_flag(k) for k in unknown])
        return cls(**{k: v for k, v in given.items() if k in names})

    @classmethod
    def option_flags(cls) -> list[str]:
        """The command-line options this fitter takes (`svt fit --model NAME ...`)."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self", "seed", "online"}
        split = () if cls.online else ("--test-fraction", "--seed")
        return [*(_flag(n) for n in sorted(names)), *cls.extra_flags, *split]

    @classmethod
    def refuse(cls, flags: list[str]) -> ConfigError:
        """The one message for options this fitter does not take."""
        return ConfigError(f"{cls.name!r} takes no {', '.join(flags)} (its options: "
                           f"{', '.join(cls.option_flags()) or 'none'}).")

    def fit(self, data: FitData) -> Fitter:  # pragma: no cover - interface
        raise NotImplementedError

    def predict(self, frame: pl.DataFrame, ctx: PredictContext | None = None) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def to_dict(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    @classmethod
    def from_dict(cls, d: dict, path: Path | None = None) -> Fitter:  # pragma: no cover - interface
        raise NotImplementedError

    def record(self) -> dict:
        """The fit file's content: ``model``, ``svt_version``, ``created``, the fitter's own keys
        (:meth:`to_dict`) and ``training``."""
        if self.training_ is None:
            raise ConfigError(f"This {self.name} fitter has not been fitted (svt.fit.fit_runs) or loaded.")
        return {"model": self.name, "svt_version": self.svt_version_, "created": self.created_,
                **self.to_dict(), "training": self.training_}

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        """Write the fit file (and what the fitter keeps beside it, e.g. a head's safetensors); the
        JSON is written to a temporary name and renamed, so a reader never sees half a file. An
        existing file is replaced only when it is an svt fit (and ``overwrite``)."""
        path = Path(path)
        with writing(path, lambda: check_fit_out(path, overwrite)):  # checked while the output is held
            data = self.record()
            path.parent.mkdir(parents=True, exist_ok=True)
            data.update(self.save_extra(path))
            self.file_ = write_text_atomic(path, json_text(data))
        return self.file_

    @classmethod
    def load(cls, path: str | Path) -> Fitter:
        """Read a fit file as the fitter class it names (on a subclass, only a fit of that class);
        a damaged file fails here with a message rather than later with a wrong number."""
        path = Path(path)
        d = read_json(path, "Fit file")
        if not isinstance(d, dict) or d.get("model") not in FITTERS:
            raise ConfigError(f"{path}: not an svt fit (expected `model` in {', '.join(FITTERS)}).")
        if cls is not Fitter and d["model"] != cls.name:
            raise ConfigError(f"{path}: a {d['model']} fit, not a {cls.name} fit.")
        problem = training_problem(d.get("training"))
        if problem:
            raise ConfigError(f"{path}: a damaged {d['model']} fit: {problem}.")
        try:  # the fields this fitter writes, before any is read
            FITTERS[d["model"]].check_fields(d)
        except ConfigError as exc:
            raise ConfigError(f"{path}: a damaged {d['model']} fit: {str(exc).rstrip('.')}.") from None
        try:
            fit = FITTERS[d["model"]].from_dict(d, path)
            fit.check()
        except SvtError as exc:
            raise ConfigError(f"{path}: {exc}") from None
        except Exception as exc:  # a damaged file: JSON fields, weights (safetensors), pickles
            raise ConfigError(f"{path}: a damaged {d['model']} fit ({type(exc).__name__}: {exc}).") from None
        fit.training_, fit.created_, fit.svt_version_ = d["training"], d.get("created"), d.get("svt_version")
        fit.file_ = path
        return fit

    @classmethod
    def check_fields(cls, d: dict) -> None:
        """Raise a ConfigError naming the first field of the fit file's content ``d`` that is not
        what :meth:`to_dict` writes: missing, of another type or shape, a NaN/inf coefficient, a
        zero std. Each fitter checks its own fields (with the helpers of ``svt.fit.files``)
        before :meth:`from_dict` reads them, so a damaged file fails on load, never later with a
        traceback or a wrong number. Every registered fitter overrides it."""
        raise NotImplementedError(f"{cls.__name__} does not check its fit file's fields.")

    def check(self) -> None:
        """Raise an SvtError when the fit names something this installation does not know."""
        if self.table == "drafts":
            for n in getattr(self, "features", None) or [getattr(self, "feature", "q_max")]:
                if n != "hidden":
                    get_feature(n)

    def save_extra(self, path: Path) -> dict:
        """Write files beside the fit file (weights); return keys to add to it."""
        return {}

    @property
    def lossless(self) -> bool:
        """Whether trimming on this predictor keeps speculative sampling exact."""
        names = getattr(self, "features", None) or [getattr(self, "feature", "q_max")]
        return all(get_feature(n).lossless for n in names)

    def label(self) -> str:
        """A short name for tables: ``model(feature)``."""
        names = getattr(self, "features", None) or [getattr(self, "feature", "")]
        return f"{self.name}({', '.join(names)})"


FITTERS: dict[str, type[Fitter]] = {}


def _flag(option: str) -> str:
    return "--" + option.replace("_", "-")


def register_fitter(cls: type[Fitter]) -> type[Fitter]:
    """Class decorator: add a fitter to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no `name`.")
    if cls.name in FITTERS and FITTERS[cls.name] is not cls:
        raise ValueError(f"A fitter named {cls.name!r} is already registered.")
    if cls.check_fields.__func__ is Fitter.check_fields.__func__:
        raise ValueError(f"{cls.__name__} does not check its fit file's fields (`check_fields`).")
    FITTERS[cls.name] = cls
    return cls


def get_fitter(name: str) -> type[Fitter]:
    """The fitter class registered under ``name``; an unknown name lists the known ones."""
    try:
        return FITTERS[name]
    except KeyError:
        raise ConfigError(f"Unknown fitter {name!r}; known fitters: {', '.join(FITTERS)}.") from None


def feature_values(frame: pl.DataFrame, name: str) -> np.ndarray:
    """A registered feature's values on ``frame`` as float64; NaN/inf is an error."""
    from svt.features import check_feature
    from svt.features import feature_values as values

    f = get_feature(name)
    check_feature(f, frame)
    x = values(f, frame)
    if not np.isfinite(x).all():
        raise DataError(f"Feature {name!r} gives NaN/inf values on these drafts; a fit is neither trained nor scored on them.")
    return x


def check_positions(frame: pl.DataFrame, k_fit: int) -> None:
    k_run = int(frame["position"].max()) + 1 if frame.height else 0
    if k_run > k_fit:
        raise DataError(f"The fit knows {k_fit} draft positions but the run has {k_run}.")
