"""The run directory's lifecycle, in one place: refuse what must not be replaced, write an
overwrite beside the old run and swap it in at the end, commit a batch's shards (``requests``
last) and record them in run.json, find the batches a resumed run already holds, and finish the
run with its counts. Every writer of a run directory (collect, reference runs, shard merges, the
vLLM spool's finish, synthetic runs) goes through here."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from svt.errors import ConfigError
from svt.fileio import writing as locked_output
from svt.traces.io import (
    SHARD_RE,
    forget_shards,
    list_shards,
    open_run,
    read_meta,
    record_shards,
    remove_partial,
    shard_ids,
    stray_files,
    write_meta,
    write_shard,
)
from svt.traces.schema import TABLES


@dataclass
class RunSummary:
    run_dir: Path
    requests: int
    drafts: int
    labelled: int
    accepted: int
    output_tokens: int
    steps: int
    seconds: float
    resumed_batches: int

    @property
    def acceptance(self) -> float:
        return self.accepted / self.labelled if self.labelled else float("nan")


def prepare_dir(out: Path, *, resume: bool, overwrite: bool, config: dict) -> dict | None:
    """Refuse a non-empty directory unless resuming or overwriting; return the old meta on resume.
    Nothing is deleted here: an overwrite is written beside the old run and swapped in at the end."""
    if resume and overwrite:
        raise ConfigError("Use either --resume or --overwrite, not both.")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"Output {str(out)!r} exists and is not a directory.")
    non_empty = out.is_dir() and any(out.iterdir())
    if resume:
        if not non_empty:
            raise ConfigError(f"Nothing to resume: {str(out)!r} is empty or missing.")
        for table in TABLES:
            stray = stray_files(out, table)
            if stray:
                raise ConfigError(f"Cannot resume {str(out)!r}: {stray[0]} is not a shard of the run "
                                  "(shards are named part-NNNNN.parquet); move it out first.")
        meta = read_meta(out)
        if meta.get("config") != config:
            old, new = meta.get("config", {}), config
            diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
            raise ConfigError(
                f"Cannot resume {str(out)!r}: its config differs in {', '.join(diff)}. "
                "Resume with the same config, or use --overwrite."
            )
        return meta
    if non_empty:
        if not overwrite:
            raise ConfigError(
                f"Output directory {str(out)!r} is not empty; pass --resume to continue it or "
                "--overwrite to replace it."
            )
        if not (out / "run.json").is_file():
            raise ConfigError(
                f"Refusing to overwrite {str(out)!r}: it is not a run directory (no run.json)."
            )
    return None


def check_run_out(out: str | Path, overwrite: bool, inputs: dict[str, Path] | None = None) -> Path:
    """Where a whole run may be written (an import, a spool's finish): ``out`` resolved, refused
    when it is a file, when it is not empty and ``overwrite`` is off, when it is not empty and not a
    run (whatever ``overwrite`` says), or when it overlaps one of ``inputs`` (name -> path: the
    swap would delete an input, or write into it)."""
    out = Path(out).resolve()
    for what, given in (inputs or {}).items():
        src = Path(given).resolve()
        if out == src or src in out.parents or out in src.parents:
            raise ConfigError(f"--out {out} overlaps {what} {src}; write the run elsewhere.")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; expected a run directory to write.")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"{out} exists and is not empty; pass --overwrite to replace it.")
        if not (out / "run.json").is_file():  # --overwrite replaces runs, never any other folder
            raise ConfigError(f"Refusing to overwrite {out}: it is not a run directory (no run.json).")
    return out


def staging_path(out: Path) -> Path:
    """Where an overwrite is written before it replaces ``out`` (beside it, same filesystem)."""
    return out.parent / f".{out.name}.svt-new"


def swap_in(staged: Path, out: Path) -> None:
    """Replace the old run by the finished new one: rename old aside, new in, then delete old."""
    old = out.parent / f".{out.name}.svt-old"
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staged.rename(out)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def writing(out: Path, *, overwrite: bool, inputs: dict[str, Path] | None = None,
            check: Callable[[], Any] | None = None) -> Iterator[Path]:
    """Own the run directory ``out`` from its check to its swap: take the output lock, check ``out``
    while holding it (``check`` if given, else :func:`check_run_out` with ``overwrite`` and
    ``inputs``), write the run into a staging folder beside it (yielded, empty) and, when the block
    ends without an error, swap it in. On an error, a Ctrl-C or a SIGTERM turned into an exception,
    the staging folder is removed and ``out`` is as it was. Every writer of a whole run goes through
    here, so no writer can check before it locks.

        with writing(out, overwrite=overwrite) as stage:
            ...  # write the run into stage; raise to abandon it
    """
    out = Path(out)
    with locked_output(out, (lambda: check_run_out(out, overwrite, inputs)) if check is None else check):
        stage = staging_path(out)
        shutil.rmtree(stage, ignore_errors=True)  # a killed writer's leftovers (nobody holds the lock)
        try:
            yield stage
            swap_in(stage, out)
        except BaseException:
            try:
                remove_partial(stage)
            except KeyboardInterrupt:  # the same Ctrl-C, left pending by polars
                remove_partial(stage)
            raise


def swap_table(run_dir: Path, table: str, staged: Path) -> None:
    """Replace a run's ``table`` folder by ``staged`` (a finished folder of its shards, on the same
    file system): the old folder is renamed aside, the new one in, then the old one removed."""
    folder = run_dir / table
    old = run_dir / f".{table}.old"
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    staged.rename(folder)
    shutil.rmtree(old, ignore_errors=True)


def completed_batches(out: Path, old_meta: dict | None) -> set[int]:
    """Batches a resumed run already holds: those whose ``requests`` shard run.json recorded (or,
    for runs written before shard records, whose ``requests`` shard exists). Every other shard is
    left over from an interrupted batch and is removed (it is redone), with its record."""
    if not old_meta:
        return set()
    recorded = (old_meta.get("shards") or {}).get("requests")
    done = shard_ids(out, "requests")
    if recorded is not None:
        done &= {int(SHARD_RE.fullmatch(n).group(1)) for n in recorded if SHARD_RE.fullmatch(n)}
    for table in TABLES:
        for shard in list_shards(out, table):
            if int(SHARD_RE.fullmatch(shard.name).group(1)) not in done:
                shard.unlink()
                forget_shards(old_meta, table, {shard.name})
    return done


def commit_batch(out: Path, meta: dict, b: int, frames: dict[str, pl.DataFrame]) -> None:
    """Write one batch's shards (``requests`` last), then record them all in run.json: a batch is
    complete once run.json records its ``requests`` shard."""
    written = {}
    for table in ("drafts", "steps", "schedule", "hidden", "dists", "cache_drafts", "tree_drafts", "references",
                  "requests"):
        if table in frames:
            written[table] = write_shard(out, table, b, frames[table])
    for table, path in written.items():
        record_shards(meta, table, [path])
    write_meta(out, meta)


def finish_run(out: Path, meta: dict, seconds: float, resumed: int) -> RunSummary:
    run = open_run(out, deep=False)
    d = run.scan("drafts").select(
        pl.len().alias("drafts"),
        pl.col("label").is_not_null().sum().alias("labelled"),
        (pl.col("label") == 1).sum().alias("accepted"),
    ).collect().row(0, named=True)
    s = run.scan("steps").select(pl.len().alias("steps")).collect().item()
    r = run.scan("requests").select(pl.len().alias("n"), pl.col("output_ids").list.len().sum().alias("tok"))
    r = r.collect().row(0, named=True)
    meta.update({
        "status": "complete",
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "counts": {"requests": r["n"], "steps": s, "drafts": d["drafts"], "labelled": d["labelled"],
                   "accepted": d["accepted"], "output_tokens": r["tok"]},
        "last_session_seconds": round(seconds, 2),
    })
    write_meta(out, meta)
    return RunSummary(out, r["n"], d["drafts"], d["labelled"], d["accepted"], r["tok"], s, seconds,
                          resumed)
