"""Collection engines, looked up by name like fitters.

An engine turns a collect config into a run directory. Each is one small class in its own module
with ``name``, what it supports (``resumable``, ``shardable``) and ``collect(cfg, out, options)``;
``ENGINES`` names the module and class of each, imported only when that engine runs (vLLM's is not
importable without vLLM, and the collect layer does not import the plugin's). Adding an engine is
one new module and one line here::

    ENGINES["mine"] = "mypackage.engine:MyEngine"

The engine of a config is its ``engine:`` key, except that an ``hvd:`` section on svt's engine
selects the live-HVD engine (the section names the policy the engine runs), and a ``tree:`` section
the tree engine.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from svt.config import ENGINES, CollectConfig
from svt.errors import ConfigError
from svt.traces.rundir import RunSummary


@dataclass(frozen=True)
class CollectOptions:
    """What a command asks of a collection besides its config."""

    config_path: Path | None = None
    overwrite: bool = False
    resume: bool = False
    shard: tuple[int, int] | None = None
    progress: bool = True


class Engine:
    """The engine contract (see the module docstring)."""

    name: ClassVar[str] = ""
    resumable: ClassVar[bool] = False
    shardable: ClassVar[bool] = False

    def collect(self, cfg: CollectConfig, out: Path, options: CollectOptions) -> RunSummary:  # pragma: no cover
        raise NotImplementedError


def engine_name(cfg: CollectConfig) -> str:
    if cfg.engine == "svt" and cfg.hvd is not None:
        return "hvd"
    return "tree" if cfg.engine == "svt" and cfg.tree is not None else cfg.engine


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ConfigError(f"Unknown engine {name!r}: expected {', '.join(ENGINES)}.")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def collect(cfg: CollectConfig, out: str | Path, *, config_path: str | Path | None = None, resume: bool = False,
            overwrite: bool = False, progress: bool = True, shard: tuple[int, int] | None = None) -> RunSummary:
    """Run the config's engine into the run directory ``out`` (the library form of ``svt collect``).

    ``shard=(i, n)`` collects only the batches ``b % n == i`` (see :mod:`svt.collect.shards`);
    ``resume`` continues an interrupted run; ``overwrite`` replaces one only once the new run is
    complete."""
    engine = get_engine(engine_name(cfg))
    for flag, given, ok in (("--resume", resume, engine.resumable), ("--shard", shard is not None, engine.shardable)):
        if given and not ok:
            raise ConfigError(f"The {engine.name} engine collects whole runs: {flag} is not one of its options.")
    options = CollectOptions(None if config_path is None else Path(config_path), overwrite, resume, shard, progress)
    return engine.collect(cfg, Path(out), options)
