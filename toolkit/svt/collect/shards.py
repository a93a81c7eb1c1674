"""Sharded collection: ``svt collect --shard i/n`` and ``svt merge``.

A collection is a list of batches, and every batch draws from its own random stream derived from
(seed, batch index). Shard ``i`` of ``n`` collects the batches ``b`` with ``b % n == i`` into its
own run directory; its shard files keep the batch index in their names (``part-BBBBB.parquet``). So
``n`` processes, GPUs or array jobs can collect one run independently, and :func:`merge_shards`
puts the parts together into exactly the run an unsharded collection writes (same rows, same
files), after checking that the parts belong together: the same config, model weights and prompt
files, every shard present once and complete, no batch twice.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import re
import shutil
import uuid
from pathlib import Path

from svt.errors import ConfigError, SchemaError
from svt.traces.io import list_shards, open_run, read_meta, stray_files, write_meta
from svt.traces.schema import TABLES

SPEC_RE = re.compile(r"(\d+)/(\d+)")


def parse_shard(spec: str | None) -> tuple[int, int] | None:
    """``"i/n"`` (0-based i, as in a SLURM array's task id) -> (i, n)."""
    if spec is None:
        return None
    m = SPEC_RE.fullmatch(spec.strip())
    if not m or int(m.group(2)) < 1 or int(m.group(1)) >= int(m.group(2)):
        raise ConfigError(f"Bad --shard {spec!r}: expected i/n with 0 <= i < n, e.g. 0/4 (i is 0-based, like "
                          "$SLURM_ARRAY_TASK_ID).")
    return int(m.group(1)), int(m.group(2))


def shard_batches(n_batches: int, shard: tuple[int, int] | None) -> list[int]:
    """The batches shard ``(i, n)`` collects (all of them without a shard)."""
    if shard is None:
        return list(range(n_batches))
    i, n = shard
    return [b for b in range(n_batches) if b % n == i]


def check_shardable(cfg) -> None:
    """What cannot be split by batches: state carried from batch to batch."""
    if cfg.av is not None:
        raise ConfigError("--shard cannot split a live-AV collection (`av:`): collect shards without live AV.")
    if cfg.hvd is not None:
        raise ConfigError("--shard cannot split a live-HVD collection (`hvd:`).")
    if cfg.cache is not None:
        raise ConfigError("--shard cannot split `cache:`: the global suffix tree holds every earlier response, "
                          "across batches. Collect the shards without `cache`, merge them (`svt merge`), then "
                          "add the cache drafts to the merged run with `svt cache RUN`.")


# the keys of run.json that must agree between the shards of one run
SAME = ("schema_version", "config", "sampling", "k", "workload_sha256", "seed", "batches", "drafter_kinds")


def merge_shards(parts: list[str | Path], out: str | Path, *, overwrite: bool = False, link: bool = False) -> dict:
    """Merge the shard runs ``parts`` into the run ``out``; return its run.json. The merged run is
    written beside ``out`` and renamed into place when complete and verified."""
    from svt.traces.rundir import check_run_out, writing

    parts = [Path(p) for p in parts]
    if len({p.resolve() for p in parts}) != len(parts):
        raise ConfigError("The same shard is given twice.")
    metas = []
    for p in parts:
        run = open_run(p, deep=True)  # every shard file checked against its record (rows, SHA-256)
        run.require_complete()
        for table in TABLES:
            if stray_files(p, table):
                raise SchemaError(f"{p}/{table}: stray files {[f.name for f in stray_files(p, table)]}.")
        meta = read_meta(p)
        if not isinstance(meta.get("shard"), dict):
            raise ConfigError(f"{p} is not a shard (it was collected without --shard); nothing to merge.")
        if meta.get("cache") or run.has("cache_drafts"):
            raise ConfigError(f"{p} holds cache drafts. Each shard's global suffix tree saw only its own "
                              "responses, so shard cache tables do not merge into the whole run's table; "
                              "merge shards without them and run `svt cache` on the merged run.")
        metas.append(meta)
    n = metas[0]["shard"]["count"]
    problems = []
    for p, m in zip(parts, metas, strict=True):
        if m["shard"]["count"] != n:
            problems.append(f"{p} is shard {m['shard']['index']}/{m['shard']['count']}, not of {n}")
        for key in SAME:
            if m.get(key) != metas[0].get(key):
                problems.append(f"{p}: {key} differs from {parts[0]}'s")
        for role in ("target", "draft"):
            h = (m.get("models", {}).get(role) or {}).get("weights_sha256_16")
            if h != (metas[0].get("models", {}).get(role) or {}).get("weights_sha256_16"):
                problems.append(f"{p}: the {role} model's weights differ from {parts[0]}'s")
    indexes = sorted(m["shard"]["index"] for m in metas)
    if indexes != list(range(n)):
        missing = sorted(set(range(n)) - set(indexes))
        twice = sorted({i for i in indexes if indexes.count(i) > 1})
        problems.append(f"shards of {n}: " + "; ".join(x for x in (
            f"missing {', '.join(f'{i}/{n}' for i in missing)}" if missing else "",
            f"given twice {', '.join(f'{i}/{n}' for i in twice)}" if twice else "") if x))
    if problems:
        raise ConfigError("These shards do not make one run:\n  - " + "\n  - ".join(problems))
    batches = sorted(b for m in metas for b in m["shard"]["batches"])
    if batches != list(range(metas[0]["batches"])):
        raise ConfigError(f"The shards hold batches {batches}, not 0..{metas[0]['batches'] - 1} once each.")

    final = Path(out)
    inputs = {f"the shard #{i + 1}": p for i, p in enumerate(parts)}  # the output must not replace (or sit inside) an input
    check_run_out(final, overwrite, inputs)  # fails fast; checked again while the output is held
    with writing(final, overwrite=overwrite, inputs=inputs) as stage:  # replaced only when complete
        merged = _write_merged(parts, metas, stage, link)
        open_run(stage, deep=True).require_complete()  # the merged run reads back, records and all
    return merged


def _write_merged(parts: list[Path], metas: list[dict], stage: Path, link: bool) -> dict:
    stage.mkdir(parents=True)
    records: dict[str, dict] = {}
    for p, m in zip(parts, metas, strict=True):
        for table in TABLES:
            files = list_shards(p, table)
            if not files:
                continue
            (stage / table).mkdir(exist_ok=True)
            for f in files:
                dest = stage / table / f.name
                if dest.exists():
                    raise ConfigError(f"{table}/{f.name} is in two shards ({p} and another): not one run.")
                try:
                    (os.link if link else shutil.copy2)(f, dest)
                except OSError as exc:
                    if link and exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                        raise ConfigError(f"--link: cannot hard-link {f} into {stage.parent} ({exc.strerror}); hard "
                                          "links need the shards and --out on one file system. Drop --link to "
                                          "copy the files.") from None
                    raise ConfigError(f"Cannot write {dest}: {exc.strerror or exc}.") from None
            records.setdefault(table, {}).update((m.get("shards") or {}).get(table, {}))
    merged = {k: v for k, v in metas[0].items() if k not in ("shard", "shards", "counts", "run_id")}
    counts: dict[str, int] = {}
    for m in metas:
        for k, v in (m.get("counts") or {}).items():
            counts[k] = counts.get(k, 0) + v
    merged.update({
        "run_id": uuid.uuid4().hex[:12],
        "status": "complete",
        "shards": {t: dict(sorted(r.items())) for t, r in records.items()},
        "counts": counts,
        "finished": max(m.get("finished", "") for m in metas),
        "merged": {"at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                   "from": [{"run_id": m["run_id"], "path": str(p), "shard": f"{m['shard']['index']}/{m['shard']['count']}",
                             "device": m.get("device"), "seconds": m.get("last_session_seconds")}
                            for p, m in zip(parts, metas, strict=True)]},
    })
    write_meta(stage, merged)
    return merged
