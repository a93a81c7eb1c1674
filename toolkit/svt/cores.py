"""The cores this process may use, without importing torch (the metrics' thread pools read it)."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's, a job's or a
    ``taskset`` lane's share), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1
