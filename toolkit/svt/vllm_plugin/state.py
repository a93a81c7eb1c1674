"""The process's recorder (None while tracing is off): set by ``recorder.activate``, read by the hooks."""

from __future__ import annotations

from typing import Any

_ACTIVE: Any = None


def active():
    """The process's recorder (a :class:`svt.vllm_plugin.recorder.Recorder`), or None when tracing is off."""
    return _ACTIVE


def set_active(rec) -> None:
    global _ACTIVE
    _ACTIVE = rec
