"""A plain `kill` (SIGTERM) unwinds like Ctrl-C, so every writer's cleanup runs: staged runs and
temporary files are removed and the output left as it was."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def sigterm_unwinds():
    """Within the block, SIGTERM raises SystemExit(143) in the main thread (elsewhere the handler
    cannot be set, and nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _terminated(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
