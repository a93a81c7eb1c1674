"""Ray (what vLLM uses for distributed serving): ``ray.init`` of a local cluster of N CPUs, or a
running cluster joined through Ray Client (``--cluster ray://head:10001``). Optional: install
``svt[cluster-ray]``; the default engine is dask (see the scale guide for the measured comparison)."""

from __future__ import annotations

from svt.distributed.engines.base import Engine, peak_rss_gib, register
from svt.errors import ConfigError


def _call(fn, item, args):
    return fn(item, *args)


def _peak(_):
    return peak_rss_gib()


@register
class RayEngine(Engine):
    name = "ray"

    def __init__(self, n_workers: int | None, address: str | None):
        try:
            import ray
        except ImportError:
            raise ConfigError("--cluster-engine ray needs ray: pip install 'svt[cluster-ray]'.") from None
        self._ray = ray
        if address is None:
            ray.init(num_cpus=n_workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            try:  # ray://head:10001 (Ray Client) as ray.init takes it
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"Could not join the Ray cluster at {address}: {exc}.") from None
        self._n = n_workers
        self._task = ray.remote(num_cpus=1)(_call)

    def map(self, fn, items: list, *args) -> list:
        ray = self._ray
        shared = ray.put(args)  # one copy of the arguments in the object store, not one per task
        return ray.get([self._task.remote(fn, item, shared) for item in items])

    @property
    def workers(self) -> int:
        return int(self._ray.cluster_resources().get("CPU", 0))

    def peak_memory(self) -> list[float]:
        """Ray starts worker processes as tasks need them: the peaks of the processes that ran a task
        (one probe task a CPU; a worker that ran no task reports its own small peak)."""
        ray = self._ray
        probe = ray.remote(num_cpus=1)(_peak)
        return [float(x) for x in ray.get([probe.remote(i) for i in range(self.workers)])]

    def close(self) -> None:
        self._ray.shutdown()
