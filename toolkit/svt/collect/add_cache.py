"""``svt cache RUN``: add (or rebuild) the cache-draft table of an existing run, with the models its
run.json records (a reference run rebuilds its stand-in drafts too)."""

from __future__ import annotations

from pathlib import Path

from svt.collect.cache_run import build_cache_drafts, check_cacheable
from svt.collect.reference_run import recache_reference
from svt.config import CacheOptions, build_section
from svt.errors import ModelLoadError
from svt.fileio import writing
from svt.models.loading import load_pair, weights_hash
from svt.traces.io import read_meta


def add_cache_to_run(run_dir: str | Path, overrides: dict | None = None, *, device: str = "auto",
                     target: str | Path | None = None, draft: str | Path | None = None) -> dict:
    """``svt cache RUN``: build the cache table of an existing greedy run with the models recorded
    in its run.json (their weights hashes must match), options = defaults + ``overrides``."""
    run_dir = Path(run_dir)
    options = build_section(CacheOptions, {k: v for k, v in (overrides or {}).items()}, prefix="cache.").validate()
    with writing(run_dir, lambda: _cacheable(run_dir)) as meta:  # no other svt command writes the run meanwhile
        return _add_cache(run_dir, meta, options, device, target, draft)


def _cacheable(run_dir: Path) -> dict:
    """The run's run.json, once the run is found to take cache drafts (checked while it is held)."""
    meta = read_meta(run_dir)
    check_cacheable(run_dir, meta)
    return meta


def _add_cache(run_dir: Path, meta: dict, options: CacheOptions, device: str, target, draft) -> dict:
    if meta.get("engine") == "reference":
        return recache_reference(run_dir, options, device, target=target, draft=draft)
    models = meta.get("models") or {}
    paths = {}
    moved = {"target": target, "draft": draft}
    for role in ("target", "draft"):
        info = models.get(role) or {}
        if not info.get("path") and moved[role] is None:
            raise ModelLoadError(f"{run_dir}: run.json does not name the {role} model (`models.{role}.path`).")
        path = Path(str(moved[role] or info["path"]))
        if not path.is_dir():
            raise ModelLoadError(f"{run_dir}: run.json names the {role} model at {str(path)!r}, which is not a "
                                 "directory here.")
        if info.get("weights_sha256_16") and weights_hash(path) != info["weights_sha256_16"]:
            raise ModelLoadError(f"{path}: its weights differ from the {role} this run was collected with "
                                 f"(hash {weights_hash(path)} vs {info['weights_sha256_16']}).")
        paths[role] = path
    dtype = models.get("dtype") or "auto"
    pair = load_pair(paths["target"], paths["draft"], device=device,
                     dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "auto")
    return build_cache_drafts(run_dir, options, pair.draft, pair.tokenizer, target=pair.target)
