"""Dask's distributed scheduler: a ``LocalCluster`` of N single-threaded worker processes, or a
running scheduler joined by address (``dask scheduler`` / ``dask worker`` on other machines)."""

from __future__ import annotations

from svt.distributed.engines.base import Engine, peak_rss_gib, register
from svt.errors import ConfigError

HANDSHAKE_S = 5.0  # a dask scheduler greets a new connection at once; a port silent this long is not one


def probe_scheduler(address: str, seconds: float = HANDSHAKE_S) -> None:
    """Refuse a ``tcp://`` address whose port answers but is not a dask scheduler (an HTTP server, a
    database), before dask's own handshake, which waits on such a port without end: a scheduler
    writes its handshake as soon as a connection opens, so one that sends nothing within
    ``seconds``, or sends text, is something else. Other protocols (tls://, ucx://) go to dask as
    they are."""
    import socket

    if not address.startswith("tcp://"):
        return
    from distributed.comm.addressing import parse_host_port

    try:
        host, port = parse_host_port(address.removeprefix("tcp://"))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"Could not join the dask scheduler at {address}: {exc}.") from None
    try:
        sock = socket.create_connection((host, port), timeout=seconds)
    except TimeoutError:
        raise ConfigError(f"Could not join the dask scheduler at {address}: no answer within {seconds:g} s (a wrong "
                          "host, or a firewall that drops the connection).") from None
    except OSError as exc:
        raise ConfigError(f"Could not join the dask scheduler at {address}: {exc}.") from None
    try:
        with sock:
            sock.settimeout(seconds)
            first = sock.recv(16)
    except TimeoutError:
        raise ConfigError(f"Could not join the dask scheduler at {address}: the port answers but sent no dask "
                          f"handshake within {seconds:g} s: not a dask scheduler, or one too busy to greet a "
                          "connection (check the port: `dask scheduler` prints its address).") from None
    except OSError as exc:
        raise ConfigError(f"Could not join the dask scheduler at {address}: {exc}.") from None
    if not first or first[:4] in (b"HTTP", b"SSH-", b"<!DO", b"<htm", b"220 ", b"+OK ", b"-ERR"):
        what = f"it answered {first[:12]!r}" if first else "it closed the connection"
        raise ConfigError(f"Could not join the dask scheduler at {address}: {what}, which is not a dask scheduler's "
                          "handshake (check the port: `dask scheduler` prints its address).")


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
            probe_scheduler(address)
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
