"""The cores a process may use are its affinity's (a container's, a job's, a `taskset` lane's), and
the metrics' second thread and the report's scoring pool follow them, not the machine's count."""

import os

import pytest


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_a_process_pinned_to_one_core_walks_on_one_thread(monkeypatch):
    from svt.cores import available_cores
    from svt.metrics import ordered

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert available_cores() == 1
    assert not ordered._two_cores(ordered.BESIDE)  # from the main thread, a pinned process stays on one
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 5})
    assert available_cores() == 2 and ordered._two_cores(ordered.BESIDE)
