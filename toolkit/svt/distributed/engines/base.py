"""The engine interface, its registry and the ``--cluster`` spec (see :mod:`svt.distributed.engines`)."""

from __future__ import annotations

import os

from svt.errors import ConfigError

ENGINES: dict[str, type] = {}


class Engine:
    """``map(fn, items, *args)`` runs ``fn(item, *args)`` on the workers and returns the results in
    the items' order; ``workers`` is how many there are; ``peak_memory()`` each one's high-water
    mark; ``close()`` stops what ``start`` started."""

    name = ""

    def map(self, fn, items: list, *args) -> list:
        raise NotImplementedError

    @property
    def workers(self) -> int:
        raise NotImplementedError

    def peak_memory(self) -> list[float]:
        """Each worker process's peak resident memory so far, in GiB (its high-water mark)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def register(cls: type) -> type:
    ENGINES[cls.name] = cls
    return cls


MAX_WORKERS_PER_CORE = 4  # a local cluster's workers: more per core only adds processes competing for it


def parse_cluster(spec: str) -> tuple[int | None, str | None]:
    """``local:N`` -> (N, None); an address (``tcp://host:port``) -> (None, address)."""
    if spec.startswith("local:"):
        try:
            n = int(spec.removeprefix("local:"))
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"Expected --cluster local:N with N >= 1 workers, but got {spec!r}.")
        cores = os.cpu_count() or 1
        if n > MAX_WORKERS_PER_CORE * cores:  # each worker is a process of its own: hundreds would swamp the machine
            raise ConfigError(f"--cluster {spec}: {n} worker processes on a machine with {cores} cores; a local "
                              f"cluster takes at most {MAX_WORKERS_PER_CORE * cores} ({MAX_WORKERS_PER_CORE} a core). "
                              "For more workers, start a scheduler and workers on other machines and pass its "
                              "address.")
        return n, None
    if "://" not in spec:
        raise ConfigError(f"Expected --cluster local:N or a scheduler address such as tcp://host:8786, but got {spec!r}.")
    return None, spec


def peak_rss_gib() -> float:
    """This process's peak resident memory in GiB (Linux: ``ru_maxrss`` is in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
