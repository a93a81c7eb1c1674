"""Distributed engines behind one small interface (:class:`~svt.distributed.engines.base.Engine`):
start a cluster (``local:N``) or join one (an address), map a function over items on its workers,
close. One engine a file registered by name (:func:`~svt.distributed.engines.base.register`), so a
second engine is one new file and one import below."""

from __future__ import annotations

from svt.distributed.engines.base import ENGINES, Engine, parse_cluster, register  # noqa: F401
from svt.errors import ConfigError


def start(spec: str, engine: str = "dask") -> Engine:
    """A cluster of the named engine: started locally (``local:N``) or joined (an address)."""
    from svt.distributed.engines import dask_engine, ray_engine  # noqa: F401  (each engine registers itself)

    if engine not in ENGINES:
        raise ConfigError(f"Unknown --cluster-engine {engine!r}; known: {', '.join(sorted(ENGINES))}.")
    n, address = parse_cluster(spec)
    return ENGINES[engine](n, address)
