"""The fit file around a fitter: where one may be written, whether a file is one, whether its
``training`` block (which runs, which requests) is whole, the names fits get in a report, and the
checks of a fit file's fields (a finite number, a finite array of a shape, a positive std, a name,
an options object) with which each fitter's ``check_fields`` says which field of a file is wrong.

The fitter itself writes and reads the file (:meth:`svt.fit.base.Fitter.save`, ``Fitter.load``);
what is here needs no fitter.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from svt.errors import ConfigError


def is_fit_file(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and {"model", "svt_version", "training"} <= data.keys()


def name_fits(paths: list, labels: list[str]) -> list[str]:
    """Each fit's name in a report: its label, and where two fits share one, the label with a short
    hash of the fit file's content, so a name never depends on the order of the ``--fit`` options
    (the regression report pairs metrics by these names). The same file given twice is refused."""
    import hashlib

    digests = [hashlib.sha256(Path(p).read_bytes()).hexdigest()[:8] for p in paths]
    seen: dict[str, str] = {}
    for p, d in zip(paths, digests, strict=True):
        if d in seen:
            raise ConfigError(f"{p} and {seen[d]} are the same fit (equal contents); give it once.")
        seen[d] = str(p)
    return [f"{lab} [{d}]" if labels.count(lab) > 1 else lab for lab, d in zip(labels, digests, strict=True)]


def check_fit_out(path: str | Path, overwrite: bool = True) -> Path:
    """Where a fit may be written, checked before any fitting: a ``.json`` name that is not a
    directory; an existing file only with ``overwrite``, and only when it is itself an svt fit
    (a report.json, a config or any other file is never replaced)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; --out takes a fit file (e.g. fits/online.json).")
    if path.suffix.lower() != ".json":
        raise ConfigError(f"Expected a fit file ending in .json, but got {path.name!r} (weights are written "
                          "beside it).")
    run = next((d for d in Path(os.path.abspath(path)).parents if (d / "run.json").is_file()), None)
    if run is not None:  # a file in a run's folders is a damaged run to its reader
        raise ConfigError(f"Refusing to write {path} inside the run directory {run}; write fits beside runs, "
                          "e.g. fits/online.json.")
    if path.exists():
        if not is_fit_file(path):
            raise ConfigError(f"Refusing to replace {path}: it is not an svt fit file. Choose another --out.")
        if not overwrite:
            raise ConfigError(f"{path} exists; pass --overwrite to replace it.")
    return path


def fit_outs(models: list[str], out: str | Path, overwrite: bool = True) -> dict[str, Path]:
    """Where each of ``models`` is written: ``out`` itself for one model, ``out/<model>.json`` for
    several (``out`` a directory, made if missing); every path is checked (``check_fit_out``)
    before any fitting, and a model named twice is refused."""
    out = Path(out)
    if not models or any(not m for m in models):
        raise ConfigError("--model: expected one model name or several separated by commas, e.g. "
                          "irls-online,logistic.")
    twice = sorted({m for m in models if models.count(m) > 1})
    if twice:
        raise ConfigError(f"--model names {', '.join(twice)} more than once.")
    if len(models) == 1:
        return {models[0]: check_fit_out(out, overwrite)}
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; with several models --out takes a directory (each fit is written "
                          "to <out>/<model>.json).")
    return {m: check_fit_out(out / f"{m}.json", overwrite) for m in models}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def training_problem(t) -> str | None:
    """What is wrong with a fit's ``training`` block (which runs it saw, which requests it trained
    on): the held-out split is read from it, so a damaged one must not score a single row."""
    if not isinstance(t, dict):
        return f"`training` is {type(t).__name__}, not an object"
    runs = t.get("runs")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        return "`training.runs` is not a list of run records"
    for i, r in enumerate(runs):
        if not isinstance(r.get("run_id"), str | None):
            return f"`training.runs[{i}].run_id` is not a string"
        for key in ("data", "pair"):
            if key in r and not isinstance(r[key], dict):
                return f"`training.runs[{i}].{key}` is not an object"
        data = r.get("data")
        if data is not None and not (isinstance(data.get("sha256"), str) and isinstance(data.get("structure_sha256"), str)
                                     and _int(data.get("rows")) and isinstance(data.get("score_sketch"), dict)):
            return f"`training.runs[{i}].data` is not a data identity (sha256, structure_sha256, rows, score_sketch)"
    ids = t.get("train_request_ids")
    if ids is not None and not (isinstance(ids, list) and all(
            isinstance(x, list) and len(x) == 2 and all(_int(v) for v in x) and x[0] < len(runs) for x in ids)):
        return "`training.train_request_ids` is not a list of [run index, request id] pairs of integers"
    for key in ("train_request_signatures", "train_token_signatures", "train_output_signatures"):
        sigs = t.get(key)
        if sigs is not None and not (isinstance(sigs, list) and all(
                isinstance(x, str) and len(x) == 16 and all(c in "0123456789abcdef" for c in x) for x in sigs)):
            return f"`training.{key}` is not a list of 16-hex-digit request signatures"
    if "train_requests_without_tokens" in t and not _int(t["train_requests_without_tokens"]):
        return "`training.train_requests_without_tokens` is not a count (an integer >= 0)"
    return None


# The fields of a fit file, checked on load (each fitter's ``Fitter.check_fields``): a value a
# hand edit or a damaged write left wrong is one ConfigError naming the field, never a traceback
# later or a wrong number (a NaN coefficient scores nothing, a zero std divides by zero).

def _name(key: str, at: str) -> str:
    return f"{at}.{key}" if at else key


def describe(v) -> str:
    """How a value that is not what a field takes reads in a message."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, list):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return "an object"
    return repr(v) if isinstance(v, str) else str(v)  # nan, inf, a number out of range


def need(d: dict, key: str, at: str = ""):
    """The value of field ``key`` of ``d`` (an object, itself the field ``at`` of the file)."""
    if not isinstance(d, dict):
        raise ConfigError(f"`{at}` is {describe(d)}, not an object")
    if key not in d:
        raise ConfigError(f"`{_name(key, at)}` is missing")
    return d[key]


def section(d: dict, key: str, at: str = "", required: bool = True) -> dict:
    """Field ``key``, an object (``{}`` when it is absent and not ``required``)."""
    if not required and isinstance(d, dict) and key not in d:
        return {}
    v = need(d, key, at)
    if not isinstance(v, dict):
        raise ConfigError(f"`{_name(key, at)}` is {describe(v)}, not an object")
    return v


def _number(v) -> bool:
    return type(v) in (float, int) and math.isfinite(v)  # not a bool, which is an int to isinstance


def _first_bad(v, shape: tuple, name: str) -> str | None:
    """What is wrong with ``v`` as nested lists of finite numbers of ``shape`` (None, for the first
    dimension only: any length of at least one), naming the first element that is wrong; None
    when nothing is."""
    if not shape:
        return None if _number(v) else f"`{name}` is {describe(v)}, not a finite number"
    n = shape[0]
    if not isinstance(v, list):
        return f"`{name}` is {describe(v)}, not a list of {'' if n is None else f'{n} '}numbers"
    if (not v) if n is None else len(v) != n:
        return f"`{name}` has {len(v)} value{'s' * (len(v) != 1)}, expected {'at least one' if n is None else n}"
    if len(shape) == 1:  # the numbers themselves: a name is made only for a bad one
        i = next((i for i, x in enumerate(v) if not _number(x)), None)
        return None if i is None else _first_bad(v[i], (), f"{name}[{i}]")
    return next((bad for i, x in enumerate(v) if (bad := _first_bad(x, shape[1:], f"{name}[{i}]"))), None)


def finite(d: dict, key: str, shape: tuple = (), *, at: str = "", why: str = "", positive: bool = False):
    """Field ``key`` as a finite float (``shape`` ``()``) or a float64 array of ``shape`` (its first
    dimension None: any length of at least one); ``positive``: every value above 0. ``why`` says,
    in a message, what the field is expected to be (e.g. which option sets its shape)."""
    name, v = _name(key, at), need(d, key, at)
    bad = _first_bad(v, shape, name)
    if bad is None and positive:
        a = np.asarray(v, dtype=np.float64)
        if (a <= 0).any():
            i = np.argwhere(a <= 0)[0] if a.ndim else ()
            bad = f"`{name}{''.join(f'[{j}]' for j in i)}` is {a[tuple(i)]:g}, not above 0"
    if bad is not None:
        raise ConfigError(bad + (f" ({why})" if why else ""))
    return float(v) if not shape else np.asarray(v, dtype=np.float64)


def text(d: dict, key: str, at: str = "") -> str:
    """Field ``key``, a non-empty string."""
    v = need(d, key, at)
    if not isinstance(v, str) or not v:
        raise ConfigError(f"`{_name(key, at)}` is {describe(v)}, not a name")
    return v


def names(d: dict, key: str, at: str = "") -> list[str]:
    """Field ``key``, a non-empty list of distinct non-empty strings."""
    v = need(d, key, at)
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
        raise ConfigError(f"`{_name(key, at)}` is {describe(v)}, not a list of names")
    if len(set(v)) < len(v):
        raise ConfigError(f"`{_name(key, at)}` names {sorted({x for x in v if v.count(x) > 1})} more than once")
    return v


def integer(d: dict, key: str, at: str = "", minimum: int = 0) -> int:
    """Field ``key``, an integer of at least ``minimum``."""
    v = need(d, key, at)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(f"`{_name(key, at)}` is {describe(v)}, not an integer >= {minimum}")
    return v


def flag(d: dict, key: str, at: str = "", default: bool = False) -> bool:
    """Field ``key``, true or false (``default`` when absent)."""
    v = d.get(key, default) if isinstance(d, dict) else need(d, key, at)
    if not isinstance(v, bool):
        raise ConfigError(f"`{_name(key, at)}` is {describe(v)}, not true or false")
    return v


_KINDS = {"int": integer, "bool": flag, "str": text, "float": finite}


def config(d: dict, key: str, cls: type, at: str = "") -> dict:
    """Field ``key``, an object of the fields of dataclass ``cls`` (ints, floats, bools, strings):
    no field it lacks, each of its type; fields without a default are required."""
    import dataclasses

    v = section(d, key, at)
    name = _name(key, at)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(v) - set(fields))
    if unknown:
        raise ConfigError(f"`{name}` has {', '.join(f'`{u}`' for u in unknown)}, not among its fields "
                          f"({', '.join(fields)})")
    for f in fields.values():
        if f.name in v or f.default is dataclasses.MISSING:
            _KINDS[getattr(f.type, "__name__", f.type)](v, f.name, at=name)
    return v
