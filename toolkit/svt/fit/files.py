"""The fit file around a fitter: where one may be written, whether a file is one, whether its
``training`` block (which runs, which requests) is whole, and the names fits get in a report.

The fitter itself writes and reads the file (:meth:`svt.fit.base.Fitter.save`, ``Fitter.load``);
what is here needs no fitter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
    return None
