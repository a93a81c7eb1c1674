"""Collectors: the sampling math, the batched engine and the engines that write run directories.

``collect(cfg, out, ...)`` runs the config's engine (:mod:`svt.collect.engines`)."""

from svt.collect.engines import ENGINES, collect, get_engine

__all__ = ["ENGINES", "collect", "get_engine"]
