"""Dask's distributed scheduler: a ``LocalCluster`` of N single-threaded worker processes, or a
running scheduler joined by address (``dask scheduler`` / ``dask worker`` on other machines)."""

from __future__ import annotations

from svt.distributed.engines.base import Engine, peak_rss_gib, register
from svt.errors import ConfigError


@register
class DaskEngine(Engine):
    name = "dask"

    def __init__(self, n_workers: int | None, address: str | None):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ConfigError("--cluster needs dask's distributed scheduler: pip install 'svt[cluster]' "
                              "(or dask[distributed]).") from None
        self._cluster = None
        if address is None:
            # one thread a worker: the summaries are numpy/polars work that holds the GIL in parts
            import logging

            # silence_logs: a task's error reaches the caller as its exception, once, not also as the
            # workers' log of it
            self._cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                                         dashboard_address=None, silence_logs=logging.CRITICAL)
            self.client = Client(self._cluster)
        else:
            try:
                self.client = Client(address, timeout="10s")
            except (OSError, ValueError, TypeError) as exc:  # unreachable, or an address dask cannot parse
                raise ConfigError(f"Could not join the dask scheduler at {address}: {exc}.") from None

    def map(self, fn, items: list, *args) -> list:
        futures = self.client.map(fn, items, *[[a] * len(items) for a in args], pure=False)
        return self.client.gather(futures)

    @property
    def workers(self) -> int:
        return len(self.client.scheduler_info()["workers"])

    def peak_memory(self) -> list[float]:
        return [float(v) for v in self.client.run(peak_rss_gib).values()]

    def close(self) -> None:
        self.client.close()
        if self._cluster is not None:
            self._cluster.close()
